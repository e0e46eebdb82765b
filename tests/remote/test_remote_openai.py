"""A front mlxd in front of mlx-lm's own server (`mlx_lm.server`, kind:
openai): mlxd's names and surfaces on a server written by others."""

from __future__ import annotations

import httpx
import openai
import pytest

from support.daemon import daemon_in_thread, tiny_model, wait_until
from support.remote import mlx_lm_server, sse_events, write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlx-lm")
    with mlx_lm_server(tiny_model("qwen"), tmp / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def front(upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    registry = write_front(
        tmp,
        {"gpu-box": {"url": upstream, "max_concurrency": 2, "poll_interval_s": 1}},
        # mlx_lm.server calls the model it was started with `default_model`.
        [{"name": "team-model", "backend": "gpu-box", "remote_model": "default_model"}],
    )
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon


def test_non_stream_chat_matches_mlx_lm_server_answering_directly(front, upstream):
    ours = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
        model="team-model", messages=MESSAGES, max_tokens=8, temperature=0
    )
    theirs = openai.OpenAI(base_url=upstream, api_key="x", max_retries=0).chat.completions.create(
        model="default_model", messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert ours.model == "team-model"
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.completion_tokens == theirs.usage.completion_tokens == 8
    assert ours.usage.prompt_tokens == theirs.usage.prompt_tokens


def test_a_stream_comes_back_chunk_by_chunk_with_usage(front):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="x", max_retries=0)
    # Events that pile up while the front is busy go out as one frame (by
    # design), and a tiny model's first 8 tokens can all arrive in the
    # moment the front answers 200: enough tokens that they cannot.
    chunks = list(
        client.chat.completions.create(
            model="team-model", messages=MESSAGES, max_tokens=64, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.model for c in chunks} == {"team-model"}
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert chunks[-1].usage.completion_tokens == 64


def test_completions_stream_through_the_front(front):
    ask = {"model": "team-model", "prompt": "The sky is", "max_tokens": 5, "stream": True}
    events = sse_events(httpx.post(f"{front.url}/v1/completions", json=ask, timeout=60))
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    # As OpenAI: usage once, in a last chunk of no choices, and only when asked for.
    assert not [e for e in events[:-1] if "usage" in e]
    asked = sse_events(httpx.post(f"{front.url}/v1/completions", timeout=60,
                                  json={**ask, "stream_options": {"include_usage": True}}))
    assert [e["choices"] for e in asked[:-1] if "usage" in e] == [[]]
    assert asked[-2]["usage"]["completion_tokens"] == 5


def test_status_shows_an_openai_backend_reachable_without_model_states(front):
    status = wait_until(lambda: (b := front.status()["backends"][0])["reachable"] and b)
    assert status["kind"] == "openai" and status["models"] == {}
    assert status["max_concurrency"] == 2
