"""The prefix cache on every zoo family, through a real daemon: a four-turn
agent conversation reuses at least 95 % of the prompt on turns 2+, on the
single and the batched path, after an unload (restored from disk) and after
a daemon restart, and every answer is the cold one (the same model served
with its prefix cache off; the zoo's path tests hold that to plain mlx-lm).

The families cover every cache type mlx-lm makes for them: KVCache (qwen3,
mistral3, glm4_moe), MLA's latent (deepseek_v3), RotatingKVCache (gemma3_text,
gemma4_text, gpt_oss) and ArraysCache hybrids (qwen3_next, qwen3_5, lfm2,
nemotron_h), each with its real chat template.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.daemon import Daemon, daemon_process, wait_until
from zoo.zoo_support import FAMILIES, TEXT_FAMILIES, answer_text, batch_name, zoo_model

pytestmark = pytest.mark.mlx

SYSTEM = (
    "You are a careful coding agent for a Python code base. Answer questions about "
    "argparse, pathlib, json and logging. When you quote code, quote it exactly; "
    "when you are unsure, say which file you would read next. The project keeps "
    "its configuration in models.yaml, loads models on demand, unloads them when "
    "idle and serves an OpenAI-compatible API on a local port. "
) * 8
QUESTIONS = (
    "Read the configuration file and report the options",
    "Which function parses the command line arguments?",
    "Explain how the logging handlers are configured",
    "List the files that define the HTTP routes",
)


def cold_name(name: str) -> str:
    return f"{name}-cold"


class Served:
    """The module's daemon, restartable on the same registry and cache dir."""

    def __init__(self, registry: Path, root: Path) -> None:
        self.registry, self.root = registry, root
        self._context: Any = None
        self.daemon: Daemon | None = None
        self.restarted = False

    def start(self) -> None:
        self._context = daemon_process(self.registry, self.root)
        self.daemon = self._context.__enter__()

    def stop(self) -> None:
        if self._context is not None:
            self._context.__exit__(None, None, None)
            self._context = self.daemon = None

    def restart(self) -> Daemon:
        if not self.restarted:
            self.stop()  # saves every loaded model's cache on the way out
            self.start()
            self.restarted = True
        assert self.daemon is not None
        return self.daemon


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    import yaml

    root = tmp_path_factory.mktemp("zoo-prefix")
    entries = []
    for name in TEXT_FAMILIES:
        path = str(zoo_model(name))
        entries += [
            {"name": name, "path": path, "max_context": 8192},
            {"name": batch_name(name), "path": path, "max_concurrency": 4, "max_context": 8192,
             "prefix_cache": {"persist": False}},
            {"name": cold_name(name), "path": path, "max_context": 8192, "prefix_cache": {"max_bytes": 0}},
        ]
    registry = root / "models.yaml"
    registry.write_text(yaml.safe_dump({
        "manager": {"memory_budget": "6GB", "cache_dir": str(root / "cache")}, "models": entries,
    }, sort_keys=False))
    holder = Served(registry, root)
    holder.start()
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture(scope="module")
def answers() -> dict[str, list[str]]:
    """The cold answers per family, filled by the first test."""
    return {}


def turn(history: list[str], i: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": SYSTEM}]
    for j in range(i):
        messages += [{"role": "user", "content": QUESTIONS[j]}, {"role": "assistant", "content": history[j]}]
    return messages + [{"role": "user", "content": QUESTIONS[i]}]


def ask(daemon: Daemon, model: str, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    r = httpx.post(f"{daemon.url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return answer_text(body["choices"][0]["message"]), usage["prompt_tokens"], cached


def share(prompt: int, cached: int) -> float:
    return cached / prompt


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_turns_2_on_reuse_the_prompt_single_and_batched(served, answers, name):
    d = served.daemon
    cold: list[str] = []
    for i in range(len(QUESTIONS)):
        text, _, cached = ask(d, cold_name(name), turn(cold, i))
        assert cached == 0
        cold.append(text)
    answers[name] = cold
    for model in (name, batch_name(name)):
        for i in range(len(QUESTIONS)):
            text, prompt, cached = ask(d, model, turn(cold, i))
            assert text == cold[i], f"{model} turn {i + 1}: warm answer differs from cold"
            if i:
                assert share(prompt, cached) >= 0.95, f"{model} turn {i + 1}: {cached}/{prompt} cached"
    figures = d.model(name)["prefix_cache"]
    assert figures["memory_bytes"] > 0
    if FAMILIES[name].caches != ("KVCache",):
        # Caches that cannot always be trimmed keep checkpoints, counted in memory.
        assert 0 < figures["checkpoint_bytes"] <= figures["memory_bytes"]


TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name.replace('_', ' ').capitalize()} in the project and return what it finds.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
    for name in ("read_file", "grep", "list_dir", "run_tests")]


def test_mistral3_with_tools_reuses_turn_2_after_its_between_turn_prefill(served):
    """Mistral's template writes the tools before the last user message, so
    exact reuse alone stops before them; the daemon prefills the next turn's
    known part after an answer (prefix_cache.next_turn: auto), and turn 2
    reuses >= 95 % with the cold answer."""
    d = served.daemon
    name = "mistral3"

    def chat(model: str, history: list[str]) -> tuple[str, int, int]:
        messages = turn(history, len(history))
        r = httpx.post(f"{d.url}/v1/chat/completions", timeout=300, json={
            "model": model, "messages": messages, "tools": TOOLS, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return (answer_text(r.json()["choices"][0]["message"]), usage["prompt_tokens"],
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))

    first, _, _ = chat(cold_name(name), [])
    before = d.model(name)["prefix_cache"]["next_turn_prefills"] or 0
    assert chat(name, [])[0] == first
    wait_until(lambda: (d.model(name)["prefix_cache"]["next_turn_prefills"] or 0) > before, timeout=120)
    text, prompt, cached = chat(name, [first])
    assert share(prompt, cached) >= 0.95, f"{cached}/{prompt}"
    assert text == chat(cold_name(name), [first])[0]
    assert d.model(name)["prefix_cache"]["next_turn_tokens"] > 0


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_after_an_unload_the_restored_cache_answers_as_cold(served, answers, name):
    d = served.daemon
    cold = answers[name]
    r = httpx.post(f"{d.url}/v1/models/{name}/unload", json={}, timeout=120)
    assert r.json()["state"] == "unloaded"
    text, prompt, cached = ask(d, name, turn(cold, len(QUESTIONS) - 1))
    assert text == cold[-1]
    assert share(prompt, cached) >= 0.95, f"{name} restored: {cached}/{prompt}"
    assert d.model(name)["prefix_cache"]["restored_entries"] > 0


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_after_a_restart_the_restored_cache_answers_as_cold(served, answers, name):
    d = served.restart()
    cold = answers[name]
    text, prompt, cached = ask(d, name, turn(cold, len(QUESTIONS) - 1))
    assert text == cold[-1]
    assert share(prompt, cached) >= 0.95, f"{name} after restart: {cached}/{prompt}"
    assert d.model(name)["prefix_cache"]["restored_entries"] > 0
