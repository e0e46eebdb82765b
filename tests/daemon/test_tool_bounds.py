"""Tool definitions, system text and earlier calls' arguments count toward
the cheap length bound that runs before any tokenizer, and tool definitions
have a cap of their own: megabytes of tools are the same 400 on every
surface, before a lease or a tokenizer run (the model is never loaded)."""

from __future__ import annotations

import httpx
import pytest
from support.daemon import daemon_in_thread, write_registry

from mlxd.api.plan import MAX_TOOL_BYTES

pytestmark = pytest.mark.mlx

USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _schema(properties: int) -> dict:
    return {"type": "object", "properties": {
        f"field_{i:05d}": {"type": "string", "description": f"The {i}th field of the record, in full, with every detail a careful clerk would want to write down about it." * 2}
        for i in range(properties)
    }}


def _bodies(schema: dict, system: str | None = None) -> dict[str, dict]:
    """The same request on each surface: one tool with ``schema``."""
    chat_messages = ([{"role": "system", "content": system}] if system else []) + USER
    return {
        "/v1/chat/completions": {"model": "m", "messages": chat_messages, "max_tokens": 4, "tools": [
            {"type": "function", "function": {"name": "record", "parameters": schema}}]},
        "/v1/messages": {"model": "m", "messages": USER, "max_tokens": 4, **({"system": system} if system else {}),
                         "tools": [{"name": "record", "input_schema": schema}]},
        "/v1/messages/count_tokens": {"model": "m", "messages": USER, **({"system": system} if system else {}),
                                      "tools": [{"name": "record", "input_schema": schema}]},
        "/v1/responses": {"model": "m", "input": "What is the weather in Paris?", "max_output_tokens": 16,
                          **({"instructions": system} if system else {}),
                          "tools": [{"type": "function", "name": "record", "parameters": schema}]},
    }


def _message(path: str, reply: httpx.Response) -> str:
    body = reply.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert body["error"]["param"] in ("tools", "messages", "input", "instructions"), body
    return body["error"]["message"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    registry = write_registry(tmp, [{"name": "m", "model": "qwen", "max_context": 512, "tool_parser": "json_tools"}])
    with daemon_in_thread(registry, tmp) as d:
        yield d


def test_megabytes_of_tools_are_refused_by_their_cap_on_every_surface(daemon):
    schema = _schema(20_000)  # the audit's: one tool, 20,000 properties, ~5 MB
    for path, body in _bodies(schema).items():
        reply = httpx.post(f"{daemon.url}{path}", json=body, timeout=60)
        assert reply.status_code == 400, (path, reply.text)
        message = _message(path, reply)
        assert f"at most {MAX_TOOL_BYTES:,} bytes" in message, (path, message)
        if not path.startswith("/v1/messages"):
            assert reply.json()["error"]["param"] == "tools"
    assert daemon.model("m")["load_count"] == 0


def test_tools_count_toward_the_length_bound_before_tokenizing(daemon):
    # 60 KB of tools: under the cap, but far more than 512 tokens can hold.
    schema = _schema(250)
    for path, body in _bodies(schema).items():
        reply = httpx.post(f"{daemon.url}{path}", json=body, timeout=60)
        assert reply.status_code == 400, (path, reply.text)
        message = _message(path, reply)
        assert "maximum context length is 512 tokens" in message and "characters" in message, (path, message)
        if not path.startswith("/v1/messages"):
            assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert daemon.model("m")["load_count"] == 0


def test_system_text_counts_toward_the_length_bound(daemon):
    for path, body in _bodies(_schema(1), system="You are a careful assistant. " * 1000).items():
        reply = httpx.post(f"{daemon.url}{path}", json=body, timeout=60)
        assert reply.status_code == 400, (path, reply.text)
        assert "characters" in _message(path, reply), path
    assert daemon.model("m")["load_count"] == 0


def test_earlier_tool_calls_arguments_count_toward_the_length_bound(daemon):
    arguments = '{"text": "' + "x" * 40_000 + '"}'
    body = {"model": "m", "max_tokens": 4, "messages": [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "record", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]}
    reply = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded", reply.text
    assert daemon.model("m")["load_count"] == 0


def test_a_request_within_the_bounds_still_answers(daemon):
    body = _bodies(_schema(2))["/v1/messages/count_tokens"]
    reply = httpx.post(f"{daemon.url}/v1/messages/count_tokens", json=body, timeout=60)
    assert reply.status_code == 200 and reply.json()["input_tokens"] > 10
