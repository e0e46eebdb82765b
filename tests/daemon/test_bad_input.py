"""Every kind of bad input, against a real `mlxd serve` process: each is a 4xx
with OpenAI's error body, leaves no traceback in the log, and the daemon
answers a normal request right after it."""

from __future__ import annotations

import json

import httpx
import pytest
from support.daemon import daemon_process, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "Say hello"}]
CHAT_URL = "/v1/chat/completions"


def chat(**kw):
    return {"model": "qwen", "messages": CHAT, "max_tokens": 2, **kw}


def raw(text: str) -> dict:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


def nested(depth: int, leaf: str = '{"type":"string"}') -> str:
    """A JSON schema ``depth`` objects deep, as text."""
    return '{"type":"object","properties":{"a":' * depth + leaf + "}}" * depth


def deep_arguments(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


ASSISTANT_CALL = ('{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",'
                  '"function":{"name":"f","arguments":%s}}]}')
MESSAGES_URL = "/v1/messages"


# (id, method, path, httpx keyword arguments, expected status)
CASES = [
    ("seed-below-int64", "POST", CHAT_URL, {"json": chat(seed=-2**63 - 1)}, 400),
    ("seed-2**70", "POST", CHAT_URL, {"json": chat(seed=2**70)}, 400),
    ("lone-surrogate-content", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi \\ud800"}]}'), 400),
    ("lone-surrogate-part", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"\\udfff"}]}]}'),
     400),
    ("lone-surrogate-prompt", "POST", "/v1/completions", raw('{"model":"qwen","max_tokens":2,"prompt":"\\ud800"}'), 400),
    # The same text on every surface, and in what its template renders.
    ("lone-surrogate-anthropic", "POST", MESSAGES_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"\\ud800"}]}'), 400),
    ("lone-surrogate-anthropic-system", "POST", MESSAGES_URL,
     raw('{"model":"qwen","max_tokens":2,"system":[{"type":"text","text":"\\ud800"}],'
         '"messages":[{"role":"user","content":"hi"}]}'), 400),
    ("lone-surrogate-count-tokens", "POST", MESSAGES_URL + "/count_tokens",
     raw('{"model":"qwen","messages":[{"role":"user","content":"\\ud800"}]}'), 400),
    ("lone-surrogate-responses", "POST", "/v1/responses",
     raw('{"model":"qwen","max_output_tokens":2,"input":"\\ud800"}'), 400),
    ("lone-surrogate-instructions", "POST", "/v1/responses",
     raw('{"model":"qwen","max_output_tokens":2,"input":"hi","instructions":"\\ud800"}'), 400),
    ("lone-surrogate-tool-description", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
         '"function":{"name":"f","description":"\\ud800","parameters":{"type":"object"}}}]}'), 400),
    ("responses-no-input", "POST", "/v1/responses", {"json": {"model": "qwen", "input": [], "max_output_tokens": 2}},
     400),
    ("responses-only-skipped-items", "POST", "/v1/responses",
     {"json": {"model": "qwen", "input": [{"type": "reasoning", "summary": []}], "max_output_tokens": 2}}, 400),
    # JSON nested deeper than a chat template can render.
    ("deep-tool-schema", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
         '"function":{"name":"f","parameters":' + nested(300) + '}}]}'), 400),
    ("deep-tool-schema-count-tokens", "POST", MESSAGES_URL + "/count_tokens",
     raw('{"model":"qwen","messages":[{"role":"user","content":"hi"}],'
         '"tools":[{"name":"f","input_schema":' + nested(300) + '}]}'), 400),
    ("deep-tool-call-arguments", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"},'
         + ASSISTANT_CALL % json.dumps(deep_arguments(250))
         + ',{"role":"tool","tool_call_id":"c1","content":"ok"}]}'), 400),
    # Arguments are JSON text inside the body: the body's own nesting bound
    # does not reach them, Python's JSON parser's stack does.
    ("tool-call-arguments-past-the-json-parser", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"},'
         + ASSISTANT_CALL % json.dumps(deep_arguments(100_000))
         + ',{"role":"tool","tool_call_id":"c1","content":"ok"}]}'), 400),
    ("deep-tool-use-input", "POST", MESSAGES_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":'
         '[{"type":"tool_use","id":"t1","name":"f","input":' + deep_arguments(600) + '}]},{"role":"user","content":'
         '[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}]}'), 400),
    # A prompt that passes the cheap length bound but not the tokenized one:
    # a stream too is a 400, not a 200 with an error inside.
    ("stream-prompt-over-max-context", "POST", CHAT_URL,
     {"json": chat(messages=[{"role": "user", "content": "hello " * 3000}], stream=True)}, 400),
    ("stream-completion-over-max-context", "POST", "/v1/completions",
     {"json": {"model": "qwen", "prompt": "hello " * 3000, "max_tokens": 2, "stream": True}}, 400),
    ("lone-surrogate-stop", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"stop":["\\ud800"]}'), 400),
    ("repetition-penalty-infinity", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"repetition_penalty":Infinity}'),
     400),
    ("temperature-nan", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"temperature":NaN}'), 400),
    ("megabyte-model-name", "POST", CHAT_URL, {"json": chat(model="m" * (1 << 20))}, 413),
    ("long-model-name", "POST", CHAT_URL, {"json": chat(model="m" * 100_000)}, 404),
    ("unknown-model", "POST", CHAT_URL, {"json": chat(model="nope")}, 404),
    ("max-tokens-negative", "POST", CHAT_URL, {"json": chat(max_tokens=-5)}, 400),
    ("max-tokens-a-string", "POST", CHAT_URL, {"json": chat(max_tokens="lots")}, 400),
    ("messages-a-string", "POST", CHAT_URL, {"json": {"model": "qwen", "messages": "hi"}}, 400),
    ("body-a-list", "POST", CHAT_URL, {"json": [1, 2]}, 400),
    ("bad-json", "POST", CHAT_URL, raw('{"model": "qwen", "messages": ['), 400),
    ("wrong-content-type", "POST", CHAT_URL,
     {"content": json.dumps(chat()).encode(), "headers": {"content-type": "text/plain"}}, 400),
    ("body-over-the-limit", "POST", CHAT_URL, {"json": chat(messages=[{"role": "user", "content": "x" * (2 << 20)}])},
     413),
    ("prompt-far-over-max-context", "POST", CHAT_URL,
     {"json": chat(messages=[{"role": "user", "content": "word " * 100_000}])}, 400),
    ("too-many-prompts", "POST", "/v1/completions", {"json": {"model": "qwen", "prompt": ["a"] * 5, "max_tokens": 1}},
     400),
    ("foreign-origin-unload", "POST", "/v1/models/qwen/unload",
     {"json": {}, "headers": {"origin": "https://evil.example"}}, 403),
    ("foreign-origin-chat", "POST", CHAT_URL, {"json": chat(), "headers": {"origin": "http://evil.example"}}, 403),
    ("rebinding-host", "GET", "/v1/status", {"headers": {"host": "evil.example:8080"}}, 403),
    ("admin-post-as-a-form", "POST", "/v1/admin/reload",
     {"content": b"x=1", "headers": {"content-type": "application/x-www-form-urlencoded"}}, 415),
    ("admin-post-as-text", "POST", "/v1/models/qwen/load", {"content": b"{}", "headers": {"content-type": "text/plain"}},
     415),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-input")
    registry = write_registry(
        tmp,
        [{"name": "qwen", "model": "qwen", "max_context": 2048, "preload": True}],
        server={"max_body_bytes": "1MB", "max_prompts": 4},
    )
    with daemon_process(registry, tmp, "--no-watch") as d:
        yield d


@pytest.mark.parametrize("method,path,kw,status", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_and_the_daemon_stays_healthy(daemon, method, path, kw, status):
    log_before = len(daemon.log())
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        answer = http.request(method, path, **kw)
        assert answer.status_code == status, answer.text[:500]
        body = answer.json()
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert error["type"] in ("invalid_request_error", "authentication_error")
        if path.startswith(MESSAGES_URL):  # Anthropic's shape
            assert body["type"] == "error" and set(error) >= {"message", "type"}
        else:
            assert set(error) >= {"message", "type", "param", "code"}
        # Nothing the client sent is echoed back at length.
        assert len(answer.content) < 2000
        normal = http.post(CHAT_URL, json=chat())
        assert normal.status_code == 200, normal.text[:500]
        assert normal.json()["choices"][0]["message"]["content"] is not None
    new_log = daemon.log()[log_before:]
    assert "Traceback" not in new_log and "unhandled error" not in new_log
