"""A seeded differential round of the prefix cache on a hybrid and a
sliding-window family of the zoo: a conversation that grows, branches, is
asked twice, is edited, is asked four times at once, survives an unload
(saved, restored) and a clear, with stop strings, a grammar, penalties and
logprobs mixed in. Every answer of the cached engine is the answer of the same
engine with its prefix cache off, and the cache does hit.

A trimmed copy of the fuzzer that checked every zoo family (no divergence
found); kept to guard the paths a linear four-turn test does not walk.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from prefix_cache.cache_support import SYSTEM, open_engine, run
from zoo.zoo_support import zoo_spec

from mlxd.engine.worker import MlxWorker
from mlxd.engine.types import Constraint, GenerationRequest, SamplingParams
from mlxd.registry.model import PrefixCacheSpec

pytestmark = pytest.mark.mlx

WORDS = ("argparse pathlib json logging configuration models file routes handler function server port "
         "token cache prefix window checkpoint daemon memory disk answer question").split()
SCHEMA = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
OPS = ("turn", "turn", "turn", "branch", "twice", "edit", "together", "unload", "turn", "clear", "turn", "turn")


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def request(rng: random.Random, messages: list[dict[str, str]]) -> GenerationRequest:
    sampling: dict[str, Any] = {"temperature": 0.0}
    extra: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.2:
        extra["stop"] = [rng.choice(["e", " the", "."])]
    elif roll < 0.3:
        extra["constraint"] = SCHEMA
    elif roll < 0.45:
        sampling["repetition_penalty"] = 1.3
    if rng.random() < 0.3:
        extra["logprobs"] = 2
    return GenerationRequest(request_id="d", max_tokens=rng.randint(1, 32), sampling=SamplingParams(**sampling),
                             messages=messages, **extra)


async def ask(engine: Any, req: GenerationRequest) -> tuple[str, Any, list[tuple[int, float]]]:
    """The text, the last chunk and every token's (text, logprob)."""
    chunks = [chunk async for chunk in engine.generate(req)]
    logprobs = [(t.token, t.logprob) for c in chunks for t in c.logprobs or []]
    return "".join(c.text for c in chunks), chunks[-1], logprobs


async def scenario(worker: MlxWorker, name: str, seed: int, cache_dir: Path) -> tuple[list[str], int]:
    """Runs the ops on a cached engine and a cold one; returns the
    differences found and the number of requests that reused a prefix."""
    rng = random.Random(seed)

    def spec(cached: bool):
        prefix = PrefixCacheSpec(max_bytes=(64 << 20) * cached, disk_max_bytes=(256 << 20) * cached,
                                 persist=cached, next_turn=cached)
        return zoo_spec(name, prefix_cache=prefix, max_concurrency=4)

    warm, cold = await open_engine(worker, spec(True), cache_dir), await open_engine(worker, spec(False))
    conv = [{"role": "system", "content": SYSTEM * 2}]
    diffs: list[str] = []
    hits = 0

    async def check(reqs: list[GenerationRequest], op: str) -> list[str]:
        nonlocal hits
        outs = await asyncio.gather(*(ask(warm, r) for r in reqs))
        texts = []
        for r, (text, last, got) in zip(reqs, outs):
            ref_text, ref_last, ref = await ask(cold, r)
            hits += last.cached_tokens > 0
            if (text, last.finish_reason) != (ref_text, ref_last.finish_reason):
                diffs.append(f"{op}: {text!r} {last.finish_reason} != {ref_text!r} {ref_last.finish_reason}")
            if not 0 <= last.cached_tokens < last.prompt_tokens:
                diffs.append(f"{op}: cached {last.cached_tokens} of {last.prompt_tokens}")
            if r.logprobs is not None:
                if [t for t, _ in got] != [t for t, _ in ref] or any(abs(a - b) > 2e-3 for (_, a), (_, b) in zip(got, ref)):
                    diffs.append(f"{op}: logprobs differ")
            texts.append(text)
        return texts

    try:
        for op in OPS:
            question = [{"role": "user", "content": sentence(rng, rng.randint(3, 24))}]
            if op == "turn":
                [text] = await check([request(rng, conv + question)], op)
                conv = conv + question + [{"role": "assistant", "content": text}]
            elif op == "branch":
                await check([request(rng, conv[:max(1, len(conv) - 2)] + question)], op)
            elif op == "twice":
                req = request(rng, conv + question)
                await check([req], op)
                await check([req], op)
            elif op == "edit":
                edited = [*conv[:-1], {"role": "assistant", "content": conv[-1]["content"][:5] + " edited"}]
                await check([request(rng, edited + question)], op)
            elif op == "together":
                await check([request(rng, conv + [{"role": "user", "content": sentence(rng, 6)}]) for _ in range(4)], op)
            elif op == "unload":
                await warm.before_unload()
                await warm.close()
                warm = await open_engine(worker, spec(True), cache_dir)
            elif op == "clear":
                await warm.clear_prefix_cache()
    finally:
        await warm.before_unload()
        await warm.close()
        await cold.close()
    return diffs, hits


@pytest.mark.parametrize("name", ["qwen3_next", "gemma3_text"])
def test_cached_answers_are_the_cold_ones_through_branches_reloads_and_clears(worker, tmp_path, name):
    diffs, hits = run(scenario(worker, name, 8, tmp_path))
    assert diffs == []
    assert hits >= 8
