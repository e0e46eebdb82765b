"""Thinking through a remote entry: the controls go to the backend (its
template renders the no-think prompt, its engine keeps the budget) and its
reasoning comes back split, from another mlxd (``reasoning_content``,
``reasoning_tokens``) and from mlx_lm.server (``reasoning``)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from support.daemon import Daemon, daemon_in_thread, daemon_process, write_registry
from support.remote import mlx_lm_server, write_front
from zoo.zoo_support import zoo_model

pytestmark = [pytest.mark.mlx, pytest.mark.slow]
MESSAGES = [{"role": "user", "content": "Read the configuration file and report the errors"}]
BUDGET = 5


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    tmp = tmp_path_factory.mktemp("thinking-backend")
    # qwen3_5's template opens the think block; a random model never closes it.
    registry = write_registry(tmp, [{"name": "thinker", "path": str(zoo_model("qwen3_5"))}])
    with daemon_process(registry, tmp) as backend, mlx_lm_server(zoo_model("qwen3_5"), tmp / "mlx_lm.log") as peer:
        front_dir = tmp_path_factory.mktemp("thinking-front")
        front_registry = write_front(
            front_dir,
            {"studio": {"url": backend.url + "/v1", "kind": "mlxd"}, "peer": {"url": peer}},
            [
                {"name": "far", "backend": "studio", "remote_model": "thinker"},
                {"name": "peer-thinker", "backend": "peer", "remote_model": str(zoo_model("qwen3_5"))},
                {"name": "peer-quiet", "backend": "peer", "remote_model": str(zoo_model("qwen3_5")),
                 "chat_template_kwargs": {"enable_thinking": False}},
            ],
        )
        with daemon_in_thread(front_registry, front_dir) as front:
            yield front, backend


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


def ask(daemon: Daemon, model: str, **extra):
    return client(daemon).chat.completions.create(model=model, messages=MESSAGES, max_tokens=16, temperature=0,
                                                  extra_body=extra)


def test_an_mlxd_backend_keeps_the_budget_and_its_reasoning_comes_back_split(backends):
    front, backend = backends
    ours = ask(front, "far", reasoning={"max_tokens": BUDGET})
    theirs = ask(backend, "thinker", reasoning={"max_tokens": BUDGET})
    assert ours.choices[0].message.model_extra["reasoning_content"] == theirs.choices[0].message.model_extra["reasoning_content"]
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.usage.completion_tokens_details.reasoning_tokens == BUDGET + 1
    stream = client(front).chat.completions.create(
        model="far", messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
        extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    pieces = [(c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in stream if c.choices]
    assert "".join(pieces) == ours.choices[0].message.model_extra["reasoning_content"]


def test_mlx_lm_servers_reasoning_is_relayed_and_the_template_kwargs_reach_it(backends):
    front, _ = backends
    thinking = ask(front, "peer-thinker")
    assert thinking.choices[0].message.model_extra["reasoning_content"]  # its `reasoning`, relayed
    assert not thinking.choices[0].message.content
    # The registry's chat_template_kwargs and the request's go to mlx_lm.server's template.
    for quiet in (ask(front, "peer-quiet"), ask(front, "peer-thinker", chat_template_kwargs={"enable_thinking": False})):
        assert quiet.usage.prompt_tokens > thinking.usage.prompt_tokens  # <think>\n\n</think>\n\n rendered
        assert quiet.choices[0].message.content
        assert "reasoning_content" not in (quiet.choices[0].message.model_extra or {})
