"""OpenAI request fields that change the answer, end to end (a real daemon,
the tiny qwen2, the official openai client): each is honoured or refused
with a 400 naming it, never accepted and dropped.

The tiny qwen2's tokenizer has 2048 tokens; " the" is token 294."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "Read the configuration file and report the errors"}]
PROMPT = "The daemon loads models on demand and"
THE = "294"
KIND = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "bird"]}}, "required": ["kind"],
        "additionalProperties": False}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fields")
    registry = write_registry(tmp, [
        {"name": "qwen", "model": "qwen", "max_concurrency": 4},
        {"name": "solo", "model": "qwen", "max_concurrency": 1},
    ])
    with daemon_in_thread(registry, tmp) as d:
        yield d


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", ["qwen", "solo"])
def test_logit_bias_on_chat_and_completions_makes_greedy_output_the_biased_token(client, model):
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0)
    assert "the" not in plain.choices[0].message.content.split()
    chat = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=8, temperature=0, logit_bias={THE: 100}
    )
    assert chat.choices[0].message.content.split() == ["the"] * 8
    text = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, logit_bias={THE: 100})
    assert text.choices[0].text.split() == ["the"] * 8


def test_a_streamed_biased_chat_matches_the_answer(client):
    asked = {"model": "qwen", "messages": CHAT, "max_tokens": 10, "temperature": 0, "logit_bias": {THE: 7, "17": -3}}
    answer = client.chat.completions.create(**asked).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**asked, stream=True)
                       if c.choices)
    assert streamed == answer
    plain = client.chat.completions.create(model="qwen", messages=CHAT, max_tokens=10, temperature=0)
    assert plain.choices[0].message.content != answer, "the bias changed nothing: the test proves nothing"


BAD_BIASES = [
    {"abc": 5},
    {"1.5": 5},
    [1],
    "294",
    {THE: 101},
    {THE: -100.5},
    {THE: "5"},
    {THE: True},
    {THE: None},
    {"2048": 1},  # the vocabulary is ids 0-2047
    {"-1": 1},
    {"1": 1, "01": 2},
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("bias", BAD_BIASES, ids=[json.dumps(b) for b in BAD_BIASES])
def test_a_bad_logit_bias_is_a_400_naming_it(daemon, path, bias, stream):
    body = {"model": "qwen", "max_tokens": 2, "logit_bias": bias, "stream": stream}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": PROMPT})
    response = httpx.post(f"{daemon.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "logit_bias")


def test_completions_honour_response_format(client):
    schema = client.completions.create(
        model="qwen", prompt=PROMPT, max_tokens=20, temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "k", "schema": KIND}}},
    )
    assert schema.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(schema.choices[0].text), KIND)
    plain = client.completions.create(model="qwen", prompt=PROMPT, max_tokens=20, temperature=0)
    assert not plain.choices[0].text.startswith("{")
    # A biased, constrained, streamed completion: the grammar still holds.
    chunks = client.completions.create(
        model="qwen", prompt=PROMPT, max_tokens=20, temperature=0, stream=True, logit_bias={THE: 100},
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "k", "schema": KIND}}},
    )
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks if c.choices)), KIND)


def test_completions_json_object_opens_an_object_where_the_model_would_not(client):
    # A random model writes one string key until max_tokens; what matters is
    # that the grammar started an object with a key.
    reply = client.completions.create(
        model="qwen", prompt=PROMPT, max_tokens=30, temperature=0, extra_body={"response_format": {"type": "json_object"}}
    )
    assert reply.choices[0].text.startswith('{"')


REFUSED = [
    ("/v1/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/v1/completions", {"parallel_tool_calls": False}, "parallel_tool_calls"),
    ("/v1/completions", {"logprobs": 0}, "logprobs"),
    ("/v1/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ("/v1/chat/completions", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"modalities": ["text", "audio"]}, "modalities"),
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("/v1/chat/completions", {"web_search_options": {}}, "web_search_options"),
    # Completions' integer form: on chat it asked for alternatives and got none.
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,extra,param", REFUSED, ids=[f"{p[4:]}-{x}" for p, _, x in REFUSED])
def test_a_field_mlxd_cannot_honour_is_a_400_naming_it(daemon, path, extra, param, stream):
    body = {"model": "qwen", "max_tokens": 2, "stream": stream, **extra}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": PROMPT})
    response = httpx.post(f"{daemon.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3, 4]]])
def test_a_prompt_of_token_ids_is_a_400_that_says_so(daemon, prompt):
    # It said "prompt[0]: Input should be a valid string", as for a malformed body.
    response = httpx.post(f"{daemon.url}/v1/completions", json={"model": "qwen", "prompt": prompt, "max_tokens": 2},
                          timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and "token ids are not supported" in error["message"]


@pytest.mark.parametrize("model", ["qwen", "solo"])
def test_a_negative_seed_samples_as_openai_takes_it(client, model):
    # OpenAI's seed is a signed 64-bit integer (clients send -1); it was a 400.
    def sampled(seed: int, n: int = 1) -> list[str]:
        reply = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=1, seed=seed, n=n)
        return [c.message.content for c in reply.choices]

    assert sampled(-1) == sampled(-1) == sampled(2**64 - 1)  # its two's complement
    assert sampled(-2) != sampled(-1)
    # n choices use seed + i, wrapping past the top: choice 1 of -1 is seed 0's choice.
    assert sampled(-1, n=2)[1] == sampled(0)[0]


@pytest.mark.parametrize("model", ["qwen", "solo"])
def test_top_p_zero_is_greedy_as_openai_takes_it(client, model):
    # OpenAI's range is 0 to 1 and clients send 0 for "most likely only"; it was a 400.
    greedy = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10, temperature=0)
    nucleus = client.chat.completions.create(model=model, messages=CHAT, max_tokens=10, temperature=1.5, top_p=0)
    assert nucleus.choices[0].message.content == greedy.choices[0].message.content
    text = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=1.5, top_p=0)
    assert text.choices[0].text == client.completions.create(model=model, prompt=PROMPT, max_tokens=10,
                                                             temperature=0).choices[0].text


def test_text_only_modalities_are_what_mlxd_answers_anyway(client):
    reply = client.chat.completions.create(model="qwen", messages=CHAT, max_tokens=2, modalities=["text"])
    assert reply.choices[0].message.content is not None


def test_an_assistant_refusal_sent_back_is_what_the_assistant_said(client):
    # OpenAI takes an assistant's refusal back as a content part or as the
    # message's `refusal`; the part was a 400, the field was dropped.
    said = "I cannot help with that request."

    def prompt_tokens(assistant):
        messages = [*CHAT, {"role": "assistant", **assistant}, {"role": "user", "content": "Why not?"}]
        return client.chat.completions.create(model="qwen", messages=messages, max_tokens=1).usage.prompt_tokens

    as_text = prompt_tokens({"content": said})
    assert prompt_tokens({"content": [{"type": "refusal", "refusal": said}]}) == as_text
    assert prompt_tokens({"content": None, "refusal": said}) == as_text > prompt_tokens({"content": ""}) + 5
    with pytest.raises(openai.BadRequestError) as caught:  # a user's is no refusal: OpenAI refuses it too
        client.chat.completions.create(model="qwen", max_tokens=1, messages=[
            {"role": "user", "content": [{"type": "refusal", "refusal": said}]}])
    assert caught.value.body["param"] == "messages[0].content"
