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


# (id, method, path, httpx keyword arguments, expected status)
CASES = [
    ("seed-negative", "POST", CHAT_URL, {"json": chat(seed=-1)}, 400),
    ("seed-2**70", "POST", CHAT_URL, {"json": chat(seed=2**70)}, 400),
    ("lone-surrogate-content", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":"hi \\ud800"}]}'), 400),
    ("lone-surrogate-part", "POST", CHAT_URL,
     raw('{"model":"qwen","max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"\\udfff"}]}]}'),
     400),
    ("lone-surrogate-prompt", "POST", "/v1/completions", raw('{"model":"qwen","max_tokens":2,"prompt":"\\ud800"}'), 400),
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
        error = answer.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert error["type"] in ("invalid_request_error", "authentication_error")
        assert set(error) >= {"message", "type", "param", "code"}
        # Nothing the client sent is echoed back at length.
        assert len(answer.content) < 2000
        normal = http.post(CHAT_URL, json=chat())
        assert normal.status_code == 200, normal.text[:500]
        assert normal.json()["choices"][0]["message"]["content"] is not None
    new_log = daemon.log()[log_before:]
    assert "Traceback" not in new_log and "unhandled error" not in new_log
