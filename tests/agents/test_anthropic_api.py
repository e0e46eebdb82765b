"""The Anthropic Messages surface end to end: a real daemon, real tiny
models, the official anthropic client (and raw HTTP where the exact wire
matters)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from typing import Literal

import anthropic
import httpx
import jsonschema
import pydantic
import pytest
from agents.agents_support import KEY, PROMPT, WEATHER, agents_daemon, model_held, model_view
from vision.vision_support import encoded, noise_image

pytestmark = pytest.mark.mlx

USER = [{"role": "user", "content": PROMPT}]
TOOLS = [{"name": "get_weather", "description": "The forecast for a city", "input_schema": WEATHER}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with agents_daemon(tmp_path_factory.mktemp("anthropic"), heartbeat_seconds=0.2) as d:
        yield d


@pytest.fixture
def client(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0)


def test_a_message_with_the_anthropic_client(client):
    reply = client.messages.create(model="qwen", max_tokens=9, messages=USER, extra_body={"temperature": 0})
    assert reply.type == "message" and reply.role == "assistant"
    assert reply.id.startswith("msg_")
    assert reply.model == "qwen"
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text
    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 9
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens > 10


def test_system_text_blocks_and_unknown_fields_and_blocks_are_tolerated(client):
    reply = client.messages.create(
        model="qwen",
        max_tokens=4,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": PROMPT}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "redacted_thinking", "data": "abc"},
                {"type": "text", "text": "Which file?"},
            ]},
            {"role": "user", "content": [{"type": "brand_new_block", "x": 1}, {"type": "text", "text": "config.yaml"}]},
        ],
        metadata={"user_id": "u1"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"context_management": {"edits": []}, "some_future_field": True},
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "anthropic-version": "2023-06-01"},
        extra_query={"beta": "true"},
    )
    assert reply.content[0].text


def test_the_stream_sends_the_exact_event_sequence(client):
    with client.messages.stream(model="qwen", max_tokens=8, messages=USER, extra_body={"temperature": 0}) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    # The SDK hands text events out next to the raw ones; the wire order is below.
    raw = [k for k in kinds if k not in ("text",)]
    assert raw[0] == "message_start"
    assert raw[1] == "content_block_start"
    assert set(raw[2:-3]) == {"content_block_delta"}
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    whole = client.messages.create(model="qwen", max_tokens=8, messages=USER, extra_body={"temperature": 0})
    assert final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 8


@pytest.mark.parametrize("model", ["qwen", "tooly"])  # one at a time; a continuous batch
def test_a_stop_sequence_ends_the_answer_and_is_named(client, daemon, model):
    greedy = {"temperature": 0}  # (this SDK takes sampling fields through extra_body)
    full = client.messages.create(model=model, max_tokens=40, messages=USER, extra_body=greedy).content[0].text
    middle = len(full) // 2
    stop = full[middle : middle + 4]
    assert len(stop.strip()) >= 2, f"no usable stop in {full!r}"
    ask = {"model": model, "max_tokens": 40, "messages": USER, "stop_sequences": ["never appears", stop]}

    reply = client.messages.create(**ask, extra_body=greedy)
    assert reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == stop
    assert reply.content[0].text == full[: full.find(stop)]

    with client.messages.stream(**ask, extra_body=greedy) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
    assert streamed.content[0].text == full[: full.find(stop)]
    delta = next(d for n, d in _events(daemon, {**ask, **greedy, "stream": True}) if n == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}

    # Ended by itself, or by max_tokens, it names no stop sequence.
    plain = client.messages.create(**{**ask, "stop_sequences": ["never appears"], "max_tokens": 5}, extra_body=greedy)
    assert (plain.stop_reason, plain.stop_sequence) == ("max_tokens", None)
    # The OpenAI surface says what it always says for a stop string.
    chat = httpx.post(f"{daemon.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=60,
                      json={"model": model, "messages": USER, "max_tokens": 40, "temperature": 0, "stop": [stop]}).json()
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["choices"][0]["message"]["content"] == full[: full.find(stop)]


def _events(daemon, body, headers=None):
    """The stream's (event, data) pairs as they come over the wire."""
    return list(_event_stream(daemon, body, headers))


def _event_stream(daemon, body, headers=None):
    """The stream's (event, data) pairs, each as it comes over the wire."""
    with httpx.stream(
        "POST", f"{daemon.url}/v1/messages?beta=true", json=body, timeout=60,
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **(headers or {})},
    ) as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                yield name, data


def test_pings_flow_while_the_request_waits_for_the_model(daemon):
    # "qwen" serves one request at a time. The holder lets go once two pings
    # have come (a request that waited); held to the end, it ran until the
    # tiny model's context was full (about 10 s).
    names: list[str] = []
    with contextlib.ExitStack() as held:
        held.enter_context(model_held(daemon, "qwen"))
        for name, _ in _event_stream(daemon, {"model": "qwen", "max_tokens": 4, "stream": True, "messages": USER}):
            names.append(name)
            if names.count("ping") == 2:
                held.close()
    first_block = names.index("content_block_start")
    assert names[0] == "message_start"
    # More than the one ping that always follows message_start: the request waited.
    assert names[1:first_block].count("ping") >= 2
    assert set(names[1:first_block]) == {"ping"}
    assert names[-1] == "message_stop"


def test_a_full_queue_is_a_429_rate_limit_error_even_for_a_stream(daemon):
    with model_held(daemon, "narrow"):
        turned_away = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": KEY}, timeout=30, json={
            "model": "narrow", "max_tokens": 4, "stream": True, "messages": USER,
        })
    assert turned_away.status_code == 429
    assert int(turned_away.headers["retry-after"]) >= 1
    assert turned_away.json()["error"]["type"] == "rate_limit_error"


def test_a_forced_tool_choice_returns_a_schema_valid_tool_use(client):
    reply = client.messages.create(
        model="tooly", max_tokens=120, tools=TOOLS, messages=[{"role": "user", "content": "Weather in Rome?"}],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert reply.stop_reason == "tool_use"
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    # Anthropic's id shape (they were OpenAI's call_...).
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, WEATHER)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_stop_sequences_do_not_cut_a_forced_tool_use(client, daemon, choice):
    # Both stops occur in every call's JSON: applied, they would cut it at its first byte.
    ask = {"model": "tooly", "max_tokens": 120, "tools": TOOLS, "tool_choice": choice,
           "stop_sequences": ['"', "{"], "messages": [{"role": "user", "content": "Weather in Rome?"}]}
    reply = client.messages.create(**ask)
    assert (reply.stop_reason, reply.stop_sequence) == ("tool_use", None)
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    jsonschema.validate(block.input, WEATHER)
    events = _events(daemon, {**ask, "stream": True})
    assert next(d for n, d in events if n == "content_block_start")["content_block"]["id"].startswith("toolu_")
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    jsonschema.validate(json.loads(partial), WEATHER)
    assert next(d for n, d in events if n == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_any_tool_choice_streams_the_tool_use_as_input_json_deltas(daemon):
    events = _events(daemon, {
        "model": "tooly", "max_tokens": 120, "stream": True, "tools": TOOLS, "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    })
    names = [n for n, _ in events]
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    jsonschema.validate(json.loads(partial), WEATHER)
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    # The model's call markup never reaches the client as text.
    assert "<tool_call>" not in json.dumps(events)


def test_a_tool_result_round_trip(client):
    first = client.messages.create(
        model="tooly", max_tokens=120, tools=TOOLS, tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    call = next(b for b in first.content if b.type == "tool_use")
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "Sunny, 21 C"}]},
        ]},
    ]
    second = client.messages.create(model="tooly", max_tokens=6, tools=TOOLS, messages=history)
    assert second.content and second.stop_reason in ("max_tokens", "end_turn", "tool_use")
    # The result and the call were rendered into the prompt: it is longer by them.
    counted = client.messages.count_tokens(model="tooly", tools=TOOLS, messages=history).input_tokens
    without = client.messages.count_tokens(model="tooly", tools=TOOLS, messages=history[:1]).input_tokens
    assert counted > without + 10
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == counted


def test_an_image_on_the_vision_model(client):
    import base64

    data = base64.b64encode(encoded(noise_image())).decode()
    reply = client.messages.create(
        model="eyes", max_tokens=6, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
            {"type": "text", "text": "Describe the picture"},
        ]}],
    )
    assert reply.content[0].text
    plain = client.messages.create(
        model="eyes", max_tokens=6, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Describe the picture"}]
    )
    # The image was part of the prompt (its vision tokens).
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens > plain.usage.input_tokens


def test_an_image_on_a_text_model_is_an_invalid_request(client):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="qwen", max_tokens=4,
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            ]}],
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_count_tokens_uses_the_template_and_tools_without_touching_the_model(client, daemon):
    before = model_view(daemon, "counted")
    with_tools = client.messages.count_tokens(model="counted", tools=TOOLS, messages=USER).input_tokens
    without = client.messages.count_tokens(model="counted", messages=USER).input_tokens
    assert with_tools > without + 20  # the template renders the tool schema
    after = model_view(daemon, "counted")
    assert after["state"] == before["state"] == "unloaded"  # nothing was loaded to count
    # Same count as the prompt the model really gets.
    reply = client.messages.create(model="tooly", max_tokens=1, tools=TOOLS, messages=USER)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == with_tools


def test_count_tokens_refuses_tools_on_a_model_with_tool_calling_off_as_messages_does(client):
    # `qwen` has `tool_parser: none`.
    with pytest.raises(anthropic.BadRequestError) as counted:
        client.messages.count_tokens(model="qwen", tools=TOOLS, messages=USER)
    with pytest.raises(anthropic.BadRequestError) as answered:
        client.messages.create(model="qwen", max_tokens=1, tools=TOOLS, messages=USER)
    assert counted.value.body == answered.value.body
    assert counted.value.body["error"]["type"] == "invalid_request_error"
    assert "tool_parser" in counted.value.body["error"]["message"]
    # With tool_choice none the answer's prompt has no tools: nothing to refuse, nothing counted for them.
    none = {"type": "none"}
    assert (client.messages.count_tokens(model="counted", tools=TOOLS, tool_choice=none, messages=USER).input_tokens
            == client.messages.count_tokens(model="counted", messages=USER).input_tokens)


def test_count_tokens_counts_an_image_as_the_vision_model_sees_it(client, daemon):
    import base64

    def asking(*images):
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                               "data": base64.b64encode(encoded(image)).decode()}} for image in images]
        return [{"role": "user", "content": [*blocks, {"type": "text", "text": "Describe the picture"}]}]

    small, large = noise_image(1, (80, 64)), noise_image(2, (320, 256))
    counted = client.messages.count_tokens(model="eyes-counted", messages=asking(small)).input_tokens
    # More pixels, more vision tokens; the text alone has none.
    assert client.messages.count_tokens(model="eyes-counted", messages=asking(large)).input_tokens > counted
    text_only = client.messages.count_tokens(
        model="eyes-counted", messages=[{"role": "user", "content": "Describe the picture"}]).input_tokens
    assert counted > text_only
    assert model_view(daemon, "eyes-counted")["state"] == "unloaded"  # counted without the weights
    for images in ((small,), (large, small)):
        count = client.messages.count_tokens(model="eyes-counted", messages=asking(*images)).input_tokens
        reply = client.messages.create(model="eyes-counted", max_tokens=2, messages=asking(*images))
        assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == count
    # What the answer would refuse, the count refuses too.
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.count_tokens(model="eyes-counted", messages=asking(small), tools=TOOLS)
    assert "tools" in caught.value.body["error"]["message"]


def test_count_tokens_on_a_remote_entry_is_a_clear_400(tmp_path):
    from support.daemon import daemon_in_thread
    from support.remote import write_front

    registry = write_front(tmp_path, {"far": {"url": "http://127.0.0.1:9/v1"}}, [{"name": "far-model", "backend": "far"}])
    with daemon_in_thread(registry, tmp_path) as front:
        far = anthropic.Anthropic(base_url=front.url, api_key="unused", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as caught:
            far.messages.count_tokens(model="far-model", messages=USER)
    assert "backend `far`" in caught.value.body["error"]["message"]


def test_a_base64_image_source_without_its_padding_is_accepted(client):
    import base64

    raw = next(r for r in (encoded(noise_image(size=(32, 32 + i))) for i in range(6)) if len(r) % 3)
    data = base64.b64encode(raw).decode()

    def counted(text):
        return client.messages.count_tokens(model="eyes-counted", messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": text}},
            {"type": "text", "text": "Describe the picture"},
        ]}]).input_tokens

    assert data.endswith("=")
    assert counted(data.rstrip("=")) == counted(data)


def test_count_tokens_does_not_refresh_the_idle_clock(client, daemon):
    client.messages.create(model="tooly", max_tokens=1, messages=USER)
    used = model_view(daemon, "tooly")["last_used_at"]
    assert used is not None
    time.sleep(0.5)
    client.messages.count_tokens(model="tooly", tools=TOOLS, messages=USER)
    # (Read back from a monotonic clock: equal up to float rounding.)
    assert model_view(daemon, "tooly")["last_used_at"] == pytest.approx(used, abs=0.05)
    client.messages.create(model="tooly", max_tokens=1, messages=USER)
    assert model_view(daemon, "tooly")["last_used_at"] > used + 0.4


def test_errors_come_in_anthropic_shape_and_status(client, daemon):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=4, messages=USER)
    assert missing.value.body == {"type": "error", "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]}}
    assert "nope" in missing.value.body["error"]["message"]
    # A body without max_tokens: Anthropic's 400, not FastAPI's 422.
    response = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": KEY},
                          json={"model": "qwen", "messages": USER}, timeout=30)
    assert response.status_code == 400
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in response.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as bad_choice:
        client.messages.create(model="tooly", max_tokens=4, messages=USER, tools=TOOLS,
                               tool_choice={"type": "tool", "name": "not_a_tool"})
    assert "not_a_tool" in bad_choice.value.body["error"]["message"]
    # A stream opens before the lease, but what the request got wrong is still a 400.
    streamed = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": KEY}, timeout=30, json={
        "model": "tooly", "max_tokens": 4, "stream": True, "messages": USER, "tools": TOOLS,
        "tool_choice": {"type": "tool", "name": "not_a_tool"},
    })
    assert streamed.status_code == 400 and streamed.json()["error"]["type"] == "invalid_request_error"


def test_the_sdk_reads_the_request_id_from_anthropics_header(client):
    # Anthropic's SDKs read `request-id` (not X-Request-Id): it was None in
    # every message and error, the id a bug report quotes.
    reply = client.messages.create(model="qwen", max_tokens=2, messages=USER)
    assert reply._request_id.startswith("req_")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=2, messages=USER)
    assert missing.value.request_id.startswith("req_")
    own = client.messages.with_raw_response.create(model="qwen", max_tokens=2, messages=USER,
                                                   extra_headers={"x-request-id": "trace-42"})
    assert own.request_id == own.headers["x-request-id"] == "trace-42"


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_anthropics_prompt_is_too_long(client, stream):
    # Claude Code compacts the conversation on "prompt is too long" and reads
    # the two numbers for how much; mlxd's own wording started neither.
    words = "word " * 4500  # about 9,000 tokens, a 4,096-token window
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="qwen", max_tokens=4, messages=[{"role": "user", "content": words}],
                               stream=stream)
    message = caught.value.body["error"]["message"]
    numbers = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", message)
    assert numbers and int(numbers[1]) > int(numbers[2]) == 4096, message
    # Too long to be worth tokenizing: the same words, without a token count.
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="qwen", max_tokens=4, messages=[{"role": "user", "content": words * 10}])
    assert refused.value.body["error"]["message"].startswith("prompt is too long: ")


def test_x_api_key_and_bearer_both_authenticate(daemon):
    body = {"model": "qwen", "max_tokens": 2, "messages": USER}
    ok = httpx.post(f"{daemon.url}/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=30)
    bearer = httpx.post(f"{daemon.url}/v1/messages", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30)
    assert ok.status_code == bearer.status_code == 200
    wrong = anthropic.Anthropic(base_url=daemon.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(**body)
    assert caught.value.body["error"]["type"] == "authentication_error"
    missing = httpx.post(f"{daemon.url}/v1/messages", json=body, timeout=30)
    assert missing.status_code == 401 and missing.json()["type"] == "error"


def test_a_pattern_alias_claims_the_names_an_agent_asks_for(tmp_path):
    from mlxd.registry.loader import load_registry
    from support.daemon import write_registry

    registry = load_registry(write_registry(tmp_path, [
        {"name": "big", "model": "qwen", "aliases": ["claude-opus-*"]},
        {"name": "local", "model": "qwen", "aliases": ["claude-*", "sonnet"]},
        {"name": "claude-haiku-4-5", "model": "llama"},
    ]))
    assert registry.lookup("claude-opus-4-1").name == "big"  # first match wins
    assert registry.lookup("claude-sonnet-4-5").name == "local"
    assert registry.lookup("claude-haiku-4-5").name == "claude-haiku-4-5"  # exact names before patterns
    assert registry.lookup("gpt-5") is None


def test_a_document_block_is_read_as_its_text_and_a_pdf_as_a_note_saying_so(client):
    note = "The secret code is 4417. It is kept in the vault under row nine."
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": note}}
    ask = {"type": "text", "text": "What is the code?"}

    def counted(*blocks):
        return client.messages.count_tokens(model="counted", messages=[{"role": "user", "content": list(blocks)}]
                                            ).input_tokens

    alone = counted(ask)
    # As many tokens as the same text sent as a text block: the model reads it (it was left out).
    assert counted(document, ask) == counted({"type": "text", "text": note}, ask) > alone + 10
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    assert counted(pdf, ask) > alone + 10, "the note that a file could not be read is in the prompt"
    with pytest.raises(anthropic.BadRequestError) as caught:
        counted({"text": "a block without a type"}, ask)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "content[0]" in caught.value.body["error"]["message"]


class Reading(pydantic.BaseModel):
    # (The SDK strips numeric bounds from the schema it sends: enums and booleans keep a random model short.)
    gauge: Literal["low", "high"]
    ok: bool


@pytest.mark.parametrize("stream", [False, True])
def test_structured_output_follows_its_schema_through_the_sdks_parse(client, stream):
    # output_format (the SDK's parse sends it as output_config.format) was dropped: free text came back.
    ask = {"model": "qwen", "max_tokens": 40, "extra_body": {"temperature": 0.0},
           "messages": [{"role": "user", "content": "Report the gauge"}]}
    if stream:
        with client.messages.stream(**ask, output_format=Reading) as events:
            message = events.get_final_message()
    else:
        message = client.messages.parse(**ask, output_format=Reading)
    assert isinstance(message.parsed_output, Reading), message.content
    raw = {"type": "json_schema", "schema": {"type": "object", "properties": {"x": {"enum": ["a", "b"]}},
                                            "required": ["x"], "additionalProperties": False}}
    plain = client.messages.create(**{**ask, "extra_body": {"temperature": 0.0, "output_config": {"format": raw}}})
    assert json.loads(plain.content[0].text)["x"] in ("a", "b")
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(**{**ask, "extra_body": {"output_config": {"format": {"type": "json_schema"}}}})
    assert "output_config.format" in caught.value.body["error"]["message"]
