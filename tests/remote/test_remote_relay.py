"""Tool calls and images on remote entries, relayed to a second, real `mlxd
serve`: the front forwards `tools`, `tool_choice`, `response_format` and the
images (as data: URLs, after its own checks), and every surface (OpenAI chat,
Anthropic Messages, OpenAI Responses) returns the backend's tool calls as its
own. A random model never writes a valid call by itself: each call that
validates here was forced by the backend's grammar and came back through the
front."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from agents.agents_support import WEATHER
from support.daemon import daemon_in_thread, daemon_process, tiny_model, write_registry
from support.remote import sse_events, write_front
from tools.tool_models import with_template
from vision.vision_support import data_url, encoded, image_chat, noise_image, solid_image, tiny_vision_model

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}}]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Oslo this week?"}]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backend")
    tooly = with_template(tiny_model("qwen"), tmp / "qwen-tools")
    registry = write_registry(tmp, [
        {"name": "tooly", "path": str(tooly)},
        {"name": "eyes", "path": str(tiny_vision_model())},
        {"name": "words", "model": "qwen"},
    ])
    with daemon_process(registry, tmp) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("front-images")
    (folder / "noise.png").write_bytes(encoded(noise_image(seed=4)))
    return folder


@pytest.fixture(scope="module")
def front(backend, images_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    registry = write_front(
        tmp,
        {"studio": {"url": backend.url + "/v1", "kind": "mlxd"}},
        [
            {"name": "agent", "backend": "studio", "remote_model": "tooly"},
            # The front reads files under its own folder and sends their bytes.
            {"name": "vision", "backend": "studio", "remote_model": "eyes", "local_image_dir": str(images_dir)},
            {"name": "plain", "backend": "studio", "remote_model": "words"},
            # Text here, vision on the studio: a request with an image skips the target that cannot see it.
            {"name": "words-here", "model": "qwen", "tool_parser": "none"},
            {"name": "look", "targets": ["words-here", "vision"], "strategy": "spillover"},
            # words-here has tool calling off: a request with tools moves on to the agent.
            {"name": "helper", "targets": ["words-here", "agent"], "strategy": "spillover"},
            {"name": "there-first", "targets": ["plain", "words-here"], "strategy": "spillover"},
        ],
    )
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon


def openai_client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def forced_call(client, model, **kw):
    return client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=FORCED, max_tokens=120, temperature=0, **kw
    )


# --- tool calls ---------------------------------------------------------------


def test_a_forced_call_through_the_front_is_the_backends_own_call(front, backend):
    ours = forced_call(openai_client(front), "agent").choices[0]
    theirs = forced_call(openai_client(backend), "tooly").choices[0]
    assert ours.finish_reason == theirs.finish_reason == "tool_calls"
    assert ours.message.content is None
    (call,) = ours.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, call.function.arguments) == (
        theirs.message.tool_calls[0].function.name, theirs.message.tool_calls[0].function.arguments)
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_a_streamed_call_arrives_as_deltas_that_add_up_to_the_whole_call(front):
    client = openai_client(front)
    whole = forced_call(client, "agent").choices[0].message.tool_calls[0]
    chunks = list(forced_call(client, "agent", stream=True))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas) and not any(d.id for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas) == whole.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_response_format_is_enforced_by_the_backend(front):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    reply = openai_client(front).chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "Is it fine?"}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}},
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_the_anthropic_surface_returns_the_backends_call_as_a_tool_use(front):
    client = anthropic.Anthropic(base_url=front.url, api_key="unused", max_retries=0)
    tools = [{"name": "get_weather", "description": "The forecast", "input_schema": WEATHER}]
    reply = client.messages.create(
        model="agent", max_tokens=120, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
        messages=ASK,
    )
    assert reply.stop_reason == "tool_use" and reply.model == "agent"
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    assert block.name == "get_weather" and block.id
    jsonschema.validate(block.input, WEATHER)
    with client.messages.stream(
        model="agent", max_tokens=120, tools=tools, tool_choice={"type": "any"}, messages=ASK,
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    (block,) = [b for b in streamed.content if b.type == "tool_use"]
    jsonschema.validate(block.input, WEATHER)


def test_the_responses_surface_returns_the_backends_call_as_a_function_call(front):
    tool = {"type": "function", "name": "get_weather", "description": "The forecast", "parameters": WEATHER}
    response = openai_client(front).responses.create(
        model="agent", input="Weather in Oslo?", tools=[tool], tool_choice="required", max_output_tokens=120,
        store=False,
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)


def test_a_tool_result_turn_goes_to_the_backend_and_is_rendered_there(front):
    client = openai_client(front)
    first = forced_call(client, "agent").choices[0].message
    call = first.tool_calls[0]
    history = [*ASK, first.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    bare = client.chat.completions.create(model="agent", messages=ASK, tools=TOOLS, max_tokens=2)
    second = client.chat.completions.create(model="agent", messages=history, tools=TOOLS, max_tokens=2)
    # The call and its result were in the prompt the backend's template rendered.
    assert second.usage.prompt_tokens > bare.usage.prompt_tokens + 20


# --- images ---------------------------------------------------------------------

GREEDY = {"max_tokens": 10, "temperature": 0}


def test_an_image_through_the_front_is_what_the_backend_sees(front, backend):
    picture = data_url(noise_image(seed=7))
    ours = openai_client(front).chat.completions.create(model="vision", messages=image_chat(picture), **GREEDY)
    theirs = openai_client(backend).chat.completions.create(model="eyes", messages=image_chat(picture), **GREEDY)
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens
    other = openai_client(backend).chat.completions.create(
        model="eyes", messages=image_chat(data_url(solid_image((0, 0, 255), (96, 96)))), **GREEDY)
    assert other.usage.prompt_tokens != ours.usage.prompt_tokens, "a different image is a different prompt"


def test_a_file_the_front_may_read_is_sent_as_its_bytes(front, backend, images_dir):
    local = image_chat(f"file://{images_dir / 'noise.png'}")
    ours = openai_client(front).chat.completions.create(model="vision", messages=local, **GREEDY)
    inline = image_chat(data_url(noise_image(seed=4)))
    theirs = openai_client(backend).chat.completions.create(model="eyes", messages=inline, **GREEDY)
    assert ours.choices[0].message.content == theirs.choices[0].message.content


def test_an_image_streams_through_the_anthropic_surface_too(front):
    raw = encoded(noise_image(seed=7))
    import base64

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(raw).decode()}}
    client = anthropic.Anthropic(base_url=front.url, api_key="unused", max_retries=0)
    with client.messages.stream(model="vision", max_tokens=6, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "Describe the picture"}]}],
    ) as stream:
        reply = stream.get_final_message()
    assert reply.usage.input_tokens > 20 and reply.usage.output_tokens == 6


def test_the_fronts_own_checks_still_come_first(front, images_dir):
    def chat(url):
        return httpx.post(f"{front.url}/v1/chat/completions", timeout=30,
                          json={"model": "vision", "messages": image_chat(url), "max_tokens": 2})

    outside = chat(f"file://{images_dir.parent / 'elsewhere.png'}")
    assert outside.status_code == 400 and "local_image_dir" in outside.json()["error"]["message"]
    web = chat("http://127.0.0.1:9/cat.png")
    assert web.status_code == 400 and "allow_remote_images" in web.json()["error"]["message"]
    corrupt = chat("data:image/png;base64," + "iVBORw0KGgo" + "A" * 40)
    assert corrupt.status_code == 400 and corrupt.json()["error"]["param"] == "messages[0].content[1]"


def test_a_backend_text_model_refuses_images_itself(front):
    response = httpx.post(f"{front.url}/v1/chat/completions", timeout=30, json={
        "model": "plain", "messages": image_chat(data_url(noise_image())), "max_tokens": 2, "stream": True})
    assert response.status_code == 400
    assert "does not accept images" in response.json()["error"]["message"]
    assert sse_events(httpx.post(f"{front.url}/v1/chat/completions", timeout=30, json={
        "model": "plain", "messages": ASK, "max_tokens": 2, "stream": True}))[-1] == "[DONE]"


def served_by(front, name):
    return next(f for f in front.status()["failover"] if f["name"] == name)["recent"][-1]["target"]


def test_a_failover_entry_sends_an_image_only_to_a_target_that_takes_images(front):
    openai_client(front).chat.completions.create(model="look", messages=ASK, max_tokens=2)
    assert served_by(front, "look") == "words-here"
    reply = openai_client(front).chat.completions.create(
        model="look", messages=image_chat(data_url(noise_image(seed=7))), **GREEDY)
    assert reply.usage.completion_tokens == GREEDY["max_tokens"]
    assert served_by(front, "look") == "vision"


def test_a_failover_target_without_a_tool_call_format_lets_the_next_one_call_the_tool(front):
    openai_client(front).chat.completions.create(model="helper", messages=ASK, max_tokens=2)
    assert served_by(front, "helper") == "words-here"
    (call,) = forced_call(openai_client(front), "helper").choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert served_by(front, "helper") == "agent"
    here = next(t for f in front.status()["failover"] if f["name"] == "helper" for t in f["targets"]
                if t["name"] == "words-here")
    assert here["fell_through"] == 1 and "tool" in here["last_error"]


def test_log_probabilities_are_refused_on_a_remote_entry_rather_than_left_empty(front):
    for stream in (False, True):
        response = httpx.post(f"{front.url}/v1/chat/completions", timeout=30, json={
            "model": "plain", "messages": ASK, "max_tokens": 2, "logprobs": True, "stream": stream})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "logprobs"
    # A failover entry moves on to a local target, which has them.
    openai_client(front).chat.completions.create(model="there-first", messages=ASK, max_tokens=2)
    assert served_by(front, "there-first") == "plain"
    reply = openai_client(front).chat.completions.create(
        model="there-first", messages=ASK, max_tokens=2, logprobs=True, top_logprobs=2)
    assert len(reply.choices[0].logprobs.content) == 2
    assert served_by(front, "there-first") == "words-here"


def test_counting_tokens_needs_a_local_tokenizer(front):
    client = anthropic.Anthropic(base_url=front.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as remote:
        client.messages.count_tokens(model="plain", messages=ASK)
    assert "served by backend `studio`" in remote.value.message
    # A failover entry counts with its first local target's tokenizer.
    assert client.messages.count_tokens(model="there-first", messages=ASK).input_tokens > 5
