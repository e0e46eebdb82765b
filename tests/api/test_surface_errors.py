"""What each API surface answers to a request it refuses, in its own terms:
the error body's shape (Anthropic's or OpenAI's), and field names that are
the surface's own (``max_output_tokens``, ``text.format``, ``input[2]`` on the
Responses API; ``tool_use`` and image ``source`` on Anthropic's). The app from
build_daemon over ASGI with a scripted engine: nothing here needs a model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from api.test_request_path import Harness
from support.asgi import Call, running

from mlxd.tools.formats import format_named

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "Say hello"}]
MESSAGES = {"model": "m", "max_tokens": 8, "messages": CHAT}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def anthropic_error(call: Call) -> dict[str, Any]:
    body = call.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert set(body["error"]) == {"type", "message"}, body
    return body["error"]


def openai_error(call: Call) -> dict[str, Any]:
    body = call.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}, body
    return body["error"]


class BodyNeverComes(Call):
    """A client that sends its headers and then nothing."""

    async def _receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}


# --- the request guards -----------------------------------------------------------


GUARDED = [
    ({"host": "evil.example"}, 403, "permission_error"),
    ({"origin": "https://evil.example"}, 403, "permission_error"),
    ({"content-length": str(10**12)}, 413, "request_too_large"),
]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize(("headers", "status", "kind"), GUARDED)
async def test_the_guards_refuse_anthropic_paths_in_anthropic_shape(tmp_path, path, headers, status, kind):
    h = Harness(tmp_path, ["never", "stop"])
    async with running(h.app):
        call = await Call(h.app, "POST", path, MESSAGES, headers=headers).done()
    assert call.status == status
    assert anthropic_error(call)["type"] == kind
    assert call.headers["connection"] == "close"
    assert h.engine.requests == []


@pytest.mark.parametrize(("headers", "status", "kind"), GUARDED)
async def test_the_guards_refuse_openai_paths_in_openai_shape(tmp_path, headers, status, kind):
    h = Harness(tmp_path, ["never", "stop"])
    async with running(h.app):
        call = await Call(h.app, "POST", "/v1/chat/completions", {"model": "m", "messages": CHAT},
                          headers=headers).done()
    assert call.status == status
    assert openai_error(call)["code"] in ("host_not_allowed", "origin_not_allowed", "request_too_large")


async def test_a_body_that_never_comes_is_a_408_in_the_shape_of_its_surface(tmp_path):
    h = Harness(tmp_path, ["never", "stop"], body_timeout_s=0.2)
    async with running(h.app):
        anthropic = await BodyNeverComes(h.app, "POST", "/v1/messages", MESSAGES).done()
        openai = await BodyNeverComes(h.app, "POST", "/v1/responses", {"model": "m", "input": "hi"}).done()
    assert anthropic.status == 408 and anthropic_error(anthropic)["type"] == "invalid_request_error"
    assert "did not arrive" in anthropic_error(anthropic)["message"]
    assert openai.status == 408 and openai_error(openai)["code"] == "request_body_timeout"


# --- HEAD ---------------------------------------------------------------------------


async def test_head_health_answers_like_get_without_a_body(tmp_path):
    h = Harness(tmp_path, ["stop"])
    async with running(h.app):
        get = await Call(h.app, "GET", "/health").done()
        head = await Call(h.app, "HEAD", "/health").done()
    assert get.status == 200 and get.json()["status"]
    assert head.status == 200 and head.text == ""
    assert head.headers["content-type"] == get.headers["content-type"]
