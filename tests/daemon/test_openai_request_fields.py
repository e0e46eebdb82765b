"""OpenAI request fields that change the answer, end to end (a real daemon,
the tiny qwen2, the official openai client): each is honoured or refused
with a 400 naming it, never accepted and dropped.

The tiny qwen2's tokenizer has 2048 tokens; " the" is token 294."""

from __future__ import annotations

import json

import httpx
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
