"""The OpenAI Responses surface end to end: a real daemon, real tiny models,
the official openai client's responses.create."""

from __future__ import annotations

import base64
import json

import httpx
import jsonschema
import openai
import pytest
from agents.agents_support import KEY, PROMPT, WEATHER, agents_daemon, model_held

pytestmark = pytest.mark.mlx

TOOL = {"type": "function", "name": "get_weather", "description": "The forecast", "parameters": WEATHER}
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "level": {"type": "string", "enum": ["low", "high"]}},
    "required": ["ok", "level"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with agents_daemon(tmp_path_factory.mktemp("responses")) as d:
        yield d


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)


def test_a_string_input(client):
    response = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=8, temperature=0, store=False)
    assert response.id.startswith("resp_")
    assert response.object == "response" and response.model == "qwen"
    assert response.status == "incomplete"  # cut by max_output_tokens
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["message"]
    # The message the answer was cut in says so itself, and keeps its text.
    assert response.output[0].status == "incomplete"
    assert response.output_text
    assert response.usage.output_tokens == 8
    again = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=8, temperature=0, store=False)
    assert again.output_text == response.output_text


def test_instructions_and_items_with_a_function_call_output(client):
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Rome?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome", "days": 2}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Rain, 14 C"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]
    response = client.responses.create(
        model="tooly", input=items, instructions="Answer briefly.", tools=[TOOL], max_output_tokens=6, store=False
    )
    assert response.status in ("completed", "incomplete")
    bare = client.responses.create(model="tooly", input=items[:1], tools=[TOOL], max_output_tokens=6, store=False)
    # The call and its output were rendered into the prompt.
    assert response.usage.input_tokens > bare.usage.input_tokens + 10


def test_the_stream_sends_events_in_order_with_sequence_numbers(client):
    # Greedy: sampled, the random model may end the answer inside 6 tokens.
    events = list(client.responses.create(model="qwen", input=PROMPT, max_output_tokens=6, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    # Cut by max_output_tokens: the last event names that outcome, as OpenAI's stream does.
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"
    ]
    done = events[-1].response
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert events[-2].item.status == "incomplete" and done.output[0].status == "incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.output_text == text == events[-4].text
    assert done.usage.output_tokens == 6
    assert done.parallel_tool_calls is False, "what was done: not asked for, a forced call is one call"
    # Valid as the SDK's own event types, which require logprobs (its lenient parse hid the missing field).
    from openai.types.responses import ResponseTextDeltaEvent, ResponseTextDoneEvent

    for event in events:
        if event.type in ("response.output_text.delta", "response.output_text.done"):
            kind = ResponseTextDeltaEvent if event.type.endswith("delta") else ResponseTextDoneEvent
            kind.model_validate(event.model_dump())


def test_a_whole_answer_ends_the_stream_with_response_completed(client):
    events = list(client.responses.create(
        model="qwen", input="Report the status as JSON", max_output_tokens=60, stream=True,
        text={"format": {"type": "json_schema", "name": "status", "schema": ANSWER, "strict": True}},
    ))
    assert events[-1].type == "response.completed" and events[-1].response.status == "completed"
    assert events[-2].item.status == "completed" and events[-1].response.output[0].status == "completed"
    assert "response.incomplete" not in [e.type for e in events]


def test_a_required_tool_choice_streams_a_function_call(client):
    events = list(client.responses.create(
        model="tooly", input="Weather in Oslo?", tools=[TOOL], tool_choice="required", max_output_tokens=120, stream=True,
    ))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]
    call = events[-1].response.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_json_schema_text_format(client):
    response = client.responses.create(
        model="qwen", input="Report the status as JSON", max_output_tokens=60, store=False,
        text={"format": {"type": "json_schema", "name": "status", "schema": ANSWER, "strict": True}},
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), ANSWER)


@pytest.mark.parametrize("stream", [False, True])
def test_a_text_format_schema_that_does_not_compile_names_text_format(client, stream):
    # Compiled by the model's grammar compiler once it is leased, still before the stream's 200.
    gone = {"type": "object", "properties": {"x": {"$ref": "#/$defs/gone"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="qwen", input="x", max_output_tokens=4, store=False, stream=stream,
            text={"format": {"type": "json_schema", "name": "s", "schema": gone}},
        )
    assert caught.value.body["param"] == "text.format"
    assert "/$defs/gone" in caught.value.body["message"]


def test_previous_response_id_continues_a_stored_response(client):
    first = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=5)
    second = client.responses.create(model="qwen", input="And then?", max_output_tokens=3, previous_response_id=first.id)
    fresh = client.responses.create(model="qwen", input="And then?", max_output_tokens=3)
    # The earlier turn is in the prompt, and served from the prefix cache.
    assert second.usage.input_tokens > fresh.usage.input_tokens + first.usage.input_tokens - 5
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2
    unstored = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="qwen", input="x", max_output_tokens=2, previous_response_id=unstored.id)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "previous_response_not_found"  # what clients act on


def test_errors_come_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="nope", input="x")
    assert missing.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="tooly", input="x", tools=[TOOL],
                                tool_choice={"type": "function", "name": "not_a_tool"})
    assert "not_a_tool" in bad.value.body["message"]
    wrong = openai.OpenAI(base_url=client.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model="qwen", input="x")


def test_a_stream_that_cannot_get_the_model_in_time_ends_in_response_failed(client, daemon):
    with model_held(daemon, "qwen"):
        events = list(client.responses.create(
            model="qwen", input=PROMPT, max_output_tokens=4, stream=True, extra_body={"timeout": 1.5}
        ))
    assert [e.type for e in events] == ["response.created", "response.in_progress", "response.failed"]
    assert [e.sequence_number for e in events] == [0, 1, 2]
    failed = events[-1].response
    assert failed.status == "failed" and "timed out" in failed.error.message


def test_a_websocket_on_the_responses_path_is_told_to_use_http(daemon):
    # Codex falls back to HTTP at once on a 426 (a 404 or 405 costs it five reconnects).
    import websockets.sync.client
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        websockets.sync.client.connect(daemon.url.replace("http", "ws") + "/v1/responses",
                                       additional_headers={"authorization": f"Bearer {KEY}"})
    assert refused.value.response.status_code == 426
    assert b"POST /v1/responses" in refused.value.response.body
    plain = httpx.get(f"{daemon.url}/v1/responses", headers={"authorization": f"Bearer {KEY}"})
    assert plain.status_code == 426 and plain.json()["error"]["code"] == "websocket_not_supported"


def test_an_input_file_of_text_is_read_as_its_text(client):
    note = "The secret code is 4417. It is kept in the vault under row nine."

    def input_tokens(*parts):
        return client.responses.create(model="qwen", max_output_tokens=1, store=False, input=[
            {"role": "user", "content": [*parts, {"type": "input_text", "text": "What is the code?"}]}]
        ).usage.input_tokens

    data = "data:text/plain;base64," + base64.b64encode(note.encode()).decode()
    as_file = input_tokens({"type": "input_file", "file_data": data})
    assert as_file == input_tokens({"type": "input_text", "text": note}) > input_tokens() + 10


def test_a_strict_text_format_allows_no_undeclared_key(client):
    # strict was dropped on this surface, so a schema without additionalProperties let the model add keys.
    loose = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["a"]}
    response = client.responses.create(
        model="qwen", input="json", temperature=0, max_output_tokens=40, store=False,
        text={"format": {"type": "json_schema", "name": "o", "schema": loose, "strict": True}})
    assert response.status == "completed"
    assert set(json.loads(response.output_text)) == {"a"}


def test_a_function_call_output_answers_a_call_of_the_input_or_of_the_stored_chain(client):
    # An output that answers no call reached the template as the result of nothing.
    ask = {"role": "user", "content": "Weather in Rome?"}
    orphan = {"type": "function_call_output", "call_id": "call_9", "output": "Rain, 14 C"}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tooly", input=[ask, orphan], tools=[TOOL], max_output_tokens=2, store=False)
    error = caught.value.body
    assert (error["type"], error["param"]) == ("invalid_request_error", "input")
    assert error["message"].startswith("No tool call found for function call output with call_id call_9")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tooly", input=[ask, {"type": "function_call_output", "output": "Rain"}],
                                tools=[TOOL], max_output_tokens=2, store=False)
    assert caught.value.body["param"] == "input[1].call_id"
    # Codex answers an OpenAI model's local_shell_call (a type left out of the prompt) with a function_call_output.
    shell = {"type": "local_shell_call", "call_id": "call_ls", "status": "completed",
             "action": {"type": "exec", "command": ["ls"]}}
    taken = client.responses.create(model="tooly", input=[ask, shell, {**orphan, "call_id": "call_ls"}],
                                    tools=[TOOL], max_output_tokens=1, store=False)
    assert taken.status in ("completed", "incomplete")
    # The call it answers may be in the stored response it continues.
    first = client.responses.create(model="tooly", input=[ask], tools=[TOOL], tool_choice="required",
                                    max_output_tokens=120)
    call = first.output[-1]
    assert call.type == "function_call"
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tooly", input=[orphan], previous_response_id=first.id, tools=[TOOL],
                                max_output_tokens=1)
    assert caught.value.body["param"] == "input"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Rain, 14 C"}
    second = client.responses.create(model="tooly", input=[answer], previous_response_id=first.id,
                                     tools=[TOOL], max_output_tokens=1)
    assert second.status in ("completed", "incomplete")


def test_an_assistant_refusal_sent_back_is_what_the_assistant_said(client):
    # It was left out: the turn reached the template empty.
    said = "I cannot help with that request."

    def input_tokens(part):
        return client.responses.create(model="qwen", max_output_tokens=1, store=False, input=[
            {"role": "user", "content": PROMPT}, {"type": "message", "role": "assistant", "content": [part]},
            {"role": "user", "content": "Why not?"}]).usage.input_tokens

    as_text = input_tokens({"type": "output_text", "text": said})
    assert input_tokens({"type": "refusal", "refusal": said}) == as_text > input_tokens(
        {"type": "output_text", "text": ""}) + 5


def test_a_stored_response_is_retrieved_and_deleted_by_its_id(client):
    first = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=3, temperature=0)
    found = client.responses.retrieve(first.id)
    assert (found.id, found.status, found.output_text) == (first.id, first.status, first.output_text)
    assert found.usage.output_tokens == first.usage.output_tokens
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.retrieve(first.id)
    assert gone.value.body["message"] == f"Response with id '{first.id}' not found."
    # Deleted, it is no longer continued either.
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="qwen", input="x", max_output_tokens=2, previous_response_id=first.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    unstored = client.responses.create(model="qwen", input=PROMPT, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(unstored.id)


# Codex sends each MCP server's tools (and its agent tools) as a namespace.
NAMESPACE = {"type": "namespace", "name": "mcp__weather", "description": "The weather server's tools.",
             "tools": [{"type": "function", "name": "get_weather", "description": "The forecast", "parameters": WEATHER}]}


def test_a_namespaces_functions_are_in_the_prompt_and_called_by_namespace_and_name(client):
    bare = client.responses.create(model="tooly", input="Weather in Oslo?", max_output_tokens=2, store=False)
    shown = client.responses.create(model="tooly", input="Weather in Oslo?", tools=[NAMESPACE], max_output_tokens=2,
                                    store=False)
    # The function is written into the prompt (it was left out with the namespace).
    assert shown.usage.input_tokens > bare.usage.input_tokens + 20

    events = list(client.responses.create(model="tooly", input="Weather in Oslo?", tools=[NAMESPACE],
                                          tool_choice="required", max_output_tokens=120, stream=True))
    added = next(e for e in events if e.type == "response.output_item.added")
    call = events[-1].response.output[0]
    for item in (added.item, call):
        assert (item.type, item.name, item.namespace) == ("function_call", "get_weather", "mcp__weather")
    jsonschema.validate(json.loads(call.arguments), WEATHER)

    # Sent back (as Codex does, and through the stored chain), the call is the same call.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
    items = [{"role": "user", "content": "Weather in Oslo?"}, call.model_dump(exclude_none=True), result]
    again = client.responses.create(model="tooly", input=items, tools=[NAMESPACE], max_output_tokens=2, store=False)
    chained = client.responses.create(model="tooly", input=[result], previous_response_id=events[-1].response.id,
                                      tools=[NAMESPACE], max_output_tokens=2, store=False)
    # (The Responses API's input_tokens is the whole prompt, the cached ones among them.)
    assert again.usage.input_tokens == chained.usage.input_tokens
    assert chained.usage.input_tokens > shown.usage.input_tokens


def test_a_forced_call_of_a_namespaces_function_names_it_by_namespace_and_name(client):
    reply = client.responses.create(model="tooly", input="Weather in Rome?", tools=[NAMESPACE, TOOL],
                                    tool_choice={"type": "function", "name": "get_weather", "namespace": "mcp__weather"},
                                    max_output_tokens=120, store=False)
    (call,) = reply.output
    assert (call.name, call.namespace) == ("get_weather", "mcp__weather")
    plain = client.responses.create(model="tooly", input="Weather in Rome?", tools=[NAMESPACE, TOOL],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=120,
                                    store=False)
    assert (plain.output[0].name, getattr(plain.output[0], "namespace", None)) == ("get_weather", None)
