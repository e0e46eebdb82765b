"""What each API surface answers to a request it refuses, in its own terms:
the error body's shape (Anthropic's or OpenAI's), and field names that are
the surface's own (``max_output_tokens``, ``text.format``, ``input[2]`` on the
Responses API; ``tool_use`` and image ``source`` on Anthropic's). The app from
build_daemon over ASGI with a scripted engine: nothing here needs a model."""

from __future__ import annotations

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


# --- tools and tool_choice --------------------------------------------------------


def schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}


def chat_tool(name: str, parameters: Any = None, **extra: Any) -> dict[str, Any]:
    function = {"name": name, "parameters": parameters if parameters is not None else schema(a="integer"), **extra}
    return {"type": "function", "function": function}


def responses_tool(name: str, **fields: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": schema(a="integer"), **fields}


def anthropic_tool(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "input_schema": schema(a="integer"), **fields}


WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search"}


async def answer(tmp_path, path: str, body: dict[str, Any], *, tool_format: str | None = "json_tools") -> Call:
    h = Harness(tmp_path, ["fine", "stop"])
    h.engine.tool_format = format_named(tool_format) if tool_format else None
    async with running(h.app):
        call = await h.post(path, body).done()
    if call.status != 200:
        assert h.engine.requests == [], "a refused request never reaches the engine"
    return call


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "lookup"}])
async def test_anthropic_refuses_a_tool_choice_that_forces_a_call_without_tools(tmp_path, choice):
    call = await answer(tmp_path, "/v1/messages", {**MESSAGES, "tool_choice": choice})
    assert call.status == 400
    error = anthropic_error(call)
    assert error["type"] == "invalid_request_error" and "tools" in error["message"]


async def test_anthropic_tool_choice_auto_or_none_without_tools_is_plain_text(tmp_path):
    for choice in ({"type": "auto"}, {"type": "none"}):
        call = await answer(tmp_path, "/v1/messages", {**MESSAGES, "tool_choice": choice})
        assert call.status == 200 and call.json()["content"] == [{"type": "text", "text": "fine"}]


DUPLICATES = [
    ("/v1/chat/completions", {"model": "m", "messages": CHAT, "tools": [chat_tool("add"), chat_tool("add")]},
     "tools[1]"),
    ("/v1/responses", {"model": "m", "input": "hi",
                       "tools": [{"type": "web_search"}, responses_tool("add"), responses_tool("add")]}, "tools[2]"),
    ("/v1/messages", {**MESSAGES, "tools": [WEB_SEARCH, anthropic_tool("add"), anthropic_tool("add")]}, "tools[2]"),
]


def refused_at(call: Call, path: str, where: str) -> str:
    """The 400's message, its param checked where the surface has one."""
    assert call.status == 400
    if path.startswith("/v1/messages"):
        return anthropic_error(call)["message"]
    error = openai_error(call)
    assert error["param"] == where
    return error["message"]


@pytest.mark.parametrize(("path", "body", "where"), DUPLICATES)
async def test_a_tool_name_given_twice_is_a_400_naming_the_second_entry(tmp_path, path, body, where):
    message = refused_at(await answer(tmp_path, path, body), path, where)
    assert where in message and "`add`" in message


# The 400 names the schema as the surface's client spelled its field.
NOT_OBJECT_SCHEMAS = [
    ("/v1/chat/completions", {"model": "m", "messages": CHAT,
                              "tools": [chat_tool("ok"), chat_tool("s", {"type": "string"})]}, "tools[1]",
     "tools[1].function.parameters"),
    # OpenAI chat's parameters is an object when given; null is not one.
    ("/v1/chat/completions", {"model": "m", "messages": CHAT,
                              "tools": [{"type": "function", "function": {"name": "n", "parameters": None}}]},
     "tools[0]", "tools[0].function.parameters"),
    ("/v1/responses", {"model": "m", "input": "hi",
                       "tools": [{"type": "web_search"}, responses_tool("s", parameters={"type": "array"})]},
     "tools[1]", "tools[1].parameters"),
    ("/v1/messages", {**MESSAGES, "tools": [anthropic_tool("s", input_schema={"type": "string"})]}, "tools[0]",
     "tools[0].input_schema"),
    # A custom tool's input_schema is required by Anthropic's API.
    ("/v1/messages", {**MESSAGES, "tools": [WEB_SEARCH, {"name": "bare"}]}, "tools[1]", "tools[1].input_schema"),
    ("/v1/messages/count_tokens", {**MESSAGES, "tools": [anthropic_tool("s", input_schema={"type": "array"})]}, "tools[0]",
     "tools[0].input_schema"),
]


@pytest.mark.parametrize(("path", "body", "where", "field"), NOT_OBJECT_SCHEMAS)
async def test_a_tool_schema_that_is_no_object_schema_is_a_400_naming_the_surfaces_field(
    tmp_path, path, body, where, field
):
    message = refused_at(await answer(tmp_path, path, body), path, where)
    assert f"{field} must be a JSON schema of an object" in message


@pytest.mark.parametrize("parameters", [None, {}, {"properties": {"a": {"type": "integer"}}},
                                        {"type": ["object", "null"], "properties": {}}])
async def test_object_schemas_and_the_responses_null_pass(tmp_path, parameters):
    body = {"model": "m", "input": "hi", "tools": [responses_tool("f", parameters=parameters)]}
    call = await answer(tmp_path, "/v1/responses", body)
    assert call.status == 200, call.text


# --- the Responses API's own field names -----------------------------------------------


async def test_responses_text_format_must_be_an_object(tmp_path):
    for text in ({"format": "json"}, {"format": ["json_object"]}):
        call = await answer(tmp_path, "/v1/responses", {"model": "m", "input": "hi", "text": text})
        assert call.status == 400
        assert openai_error(call)["param"] == "text.format"
    ok = await answer(tmp_path, "/v1/responses", {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}})
    assert ok.status == 200


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"max_output_tokens": 10**15}, "max_output_tokens", "max_output_tokens exceeds server limit"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": "an object"}}}, "text.format",
         "text.format.schema"),
        ({"text": {"format": {"type": "json_object"}}, "tool_choice": "required", "tools": [responses_tool("f")]},
         "text.format", "text.format cannot be combined"),
        ({"input": [{"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{not json"}]},
         "input[1].arguments", "input[1].arguments is not valid JSON"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]",
         "input[0].content[0].image_url"),
        # Accepted and ignored before, as if served.
        ({"top_logprobs": 99}, "top_logprobs", "less than or equal to 20"),
        ({"truncation": "sometimes"}, "truncation", "'auto' or 'disabled'"),
        ({"background": True}, "background", "background responses are not served"),
        # Ignored, the model would answer without the conversation or prompt the client named.
        ({"conversation": "conv_123"}, "conversation", "conversations are not served"),
        ({"prompt": {"id": "pmpt_123"}}, "prompt", "prompt templates are not served"),
        # Without function tools too: no choice of them is made.
        ({"tool_choice": "bogus"}, "tool_choice", 'tool_choice must be "auto"'),
        ({"tool_choice": {"type": "function", "name": "f"}}, "tool_choice", "f"),
    ],
)
async def test_responses_errors_name_the_responses_fields(tmp_path, body, param, words):
    call = await answer(tmp_path, "/v1/responses", {"model": "m", "input": "hi", **body})
    assert call.status == 400
    error = openai_error(call)
    assert error["param"] == param
    assert words in error["message"]
    assert "max_tokens" not in error["message"] and "response_format" not in error["message"]


async def test_chat_names_a_tool_call_whose_arguments_are_not_json_before_the_engine_sees_it(tmp_path):
    messages = [*CHAT, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}, {"role": "tool", "tool_call_id": "c2", "content": "2"}]
    call = await answer(tmp_path, "/v1/chat/completions", {"model": "m", "messages": messages, "stream": True})
    assert call.status == 400
    assert openai_error(call)["param"] == "messages[1].tool_calls[1].function.arguments"


@pytest.mark.parametrize(("arguments", "kind"), [("[1, 2]", "an array"), ('"s"', "a string"), ("3", "a number"),
                                                 ("null", "null")])
async def test_chat_names_a_tool_call_whose_arguments_are_json_but_no_object(tmp_path, arguments, kind):
    # Templates walk arguments as parameters by name: Qwen3.5's raised a
    # TypeError on an array, a 500 for what the client sent.
    messages = [*CHAT, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    call = await answer(tmp_path, "/v1/chat/completions", {"model": "m", "messages": messages})
    assert call.status == 400
    error = openai_error(call)
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert error["message"].endswith(f"must be a JSON object of the function's arguments, not {kind}.")


# --- Anthropic's own field names ----------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "words"),
    [
        ([{"type": "tool_use", "id": "t1", "name": "f", "input": "{not json"}], "messages[1].content[0].input",
         "tool_use"),
        ([{"type": "tool_use", "id": "t1", "name": "f", "input": ["a"]}], "messages[1].content[0].input",
         "tool_use"),
    ],
)
async def test_anthropic_names_a_bad_tool_use_input_by_its_own_fields(tmp_path, content, where, words):
    messages = [*CHAT, {"role": "assistant", "content": content}]
    call = await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages})
    assert call.status == 400
    message = anthropic_error(call)["message"]
    assert where in message and words in message and "tool_calls" not in message


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png"}},
        {"type": "image", "source": {"type": "url"}},
        {"type": "image", "source": {"type": "file", "file_id": "f1"}},
    ],
)
async def test_anthropic_names_an_image_without_a_source_by_its_own_fields(tmp_path, block):
    body = {**MESSAGES, "model": "eyes", "messages": [{"role": "user", "content": [block]}]}
    call = await answer(tmp_path, "/v1/messages", body)
    assert call.status == 400
    message = anthropic_error(call)["message"]
    assert "messages[0].content[0].source" in message and "image_url" not in message


@pytest.mark.parametrize(("raw", "words"), [(b"[1, 2]", "is not a JSON object"), (b"", "is empty")])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/embeddings"])
async def test_a_body_that_is_no_json_object_says_so_in_the_surfaces_shape(tmp_path, path, raw, words):
    # (Form-encoded or plain-text bodies land here too: pydantic's own words named neither.)
    call = await answer(tmp_path, path, raw)  # type: ignore[arg-type]
    assert call.status == 400
    error = anthropic_error(call) if path == "/v1/messages" else openai_error(call)
    assert error["message"] == f"The request body {words}: send a JSON object with Content-Type: application/json"


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "content": "42"}], "messages[2].tool_call_id"),
])
async def test_chat_refuses_a_message_openai_refuses_naming_its_field(tmp_path, messages, param):
    # A user message with no content became an empty prompt; a tool result with no call id, anyone's.
    call = await answer(tmp_path, "/v1/chat/completions", {"model": "m", "messages": messages})
    assert call.status == 400
    assert openai_error(call)["param"] == param


async def test_anthropic_refuses_a_tool_result_that_answers_no_tool_use_before_it(tmp_path):
    use = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "42"}]}]
    call = await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages})
    assert call.status == 400
    # Anthropic's words, which Claude Code looks for.
    assert anthropic_error(call)["message"].startswith(
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_2. ")
    messages[2]["content"][0]["tool_use_id"] = "toolu_1"
    assert (await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages})).status == 200


async def test_anthropic_refuses_a_tool_use_left_without_its_result_in_the_next_message(tmp_path):
    uses = [{"type": "tool_use", "id": f"toolu_{n}", "name": "lookup", "input": {}} for n in (1, 2)]
    answered = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": uses},
                {"role": "user", "content": [answered, {"type": "text", "text": "and?"}]}]
    call = await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages})
    assert call.status == 400
    error = anthropic_error(call)
    assert error["message"].startswith("messages.1: `tool_use` ids were found without `tool_result` blocks")
    assert "toolu_2" in error["message"] and "toolu_1" not in error["message"].split("after:")[1]
    messages[2]["content"].insert(1, {**answered, "tool_use_id": "toolu_2"})
    assert (await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages})).status == 200
    # A conversation that ends with the calls is the model's turn to go on, not refused here.
    assert (await answer(tmp_path, "/v1/messages", {**MESSAGES, "messages": messages[:2]})).status == 200
