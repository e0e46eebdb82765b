"""Engine-level A/B of one request feature (a grammar, a logit bias): decode
tok/s and CPU per token of requests with it against the same requests
without, on a single-request engine and a batch of four, as the daemon runs
them (TextEngine on the MlxWorker). Shared by bench/constrained.py and
bench/logit_bias.py; each says how to make its requests."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

# (rid, max_tokens, with the feature) -> a GenerationRequest.
MakeRequest = Callable[[str, int, bool], Any]


async def timed(engine: Any, req: Any) -> tuple[float, float, int]:
    """(first token time, last chunk time, tokens) of one request."""
    first = last = 0.0
    tokens = 0
    async for chunk in engine.generate(req):
        if not chunk.completion_tokens:
            continue  # the acceptance, before the prefill
        now = time.perf_counter()
        first = first or now
        last, tokens = now, chunk.completion_tokens
    return first, last, tokens


async def decode_rate(engine: Any, make: MakeRequest, rows: int, max_tokens: int, feature: bool) -> tuple[float, float]:
    """Aggregate decode tok/s of ``rows`` concurrent requests, from the first
    token of any to the last token of all (prefill excluded), and the
    process's CPU seconds per generated token (steadier on a busy machine)."""
    cpu = time.process_time()
    results = await asyncio.gather(*(timed(engine, make(f"r{i}", max_tokens, feature)) for i in range(rows)))
    cpu = time.process_time() - cpu
    for _, _, tokens in results:
        assert tokens == max_tokens, (tokens, max_tokens)
    start = max(first for first, _, _ in results)  # all rows decoding
    end = max(last for _, last, _ in results)
    generated = sum(tokens for *_, tokens in results) - rows  # tokens after each first one
    rate = generated / (end - start) if end > start else float("nan")
    return rate, cpu / (rows * max_tokens)


async def compare(engine: Any, make: MakeRequest, label: str, rows: int, max_tokens: int,
                  repeats: int) -> dict[str, Any]:
    """Runs without and with the feature, alternating after a warm-up of
    each; the figures' keys name the feature's side ``label``."""
    await decode_rate(engine, make, rows, 16, True)  # warm-up: JIT kernels, a grammar's compile
    await decode_rate(engine, make, rows, 16, False)
    free, featured, free_cpu, featured_cpu = [], [], [], []
    for _ in range(repeats):
        rate, cpu = await decode_rate(engine, make, rows, max_tokens, False)
        free.append(rate)
        free_cpu.append(cpu)
        rate, cpu = await decode_rate(engine, make, rows, max_tokens, True)
        featured.append(rate)
        featured_cpu.append(cpu)
    f, c = max(free), max(featured)
    fc, cc = statistics.median(free_cpu), statistics.median(featured_cpu)
    return {
        "rows": rows,
        # Best of the runs: on a shared machine the slow runs measure the neighbours.
        "free_tok_s": round(f, 1),
        f"{label}_tok_s": round(c, 1),
        "ratio": round(c / f, 3),
        "ratio_of_medians": round(statistics.median(featured) / statistics.median(free), 3),
        # CPU time per token (prompt included, the same for both), median.
        "free_cpu_ms_per_token": round(fc * 1000, 3),
        f"{label}_cpu_ms_per_token": round(cc * 1000, 3),
        "cpu_ratio": round(fc / cc, 3),
        "free_runs": [round(x, 1) for x in free],
        f"{label}_runs": [round(x, 1) for x in featured],
    }


async def single_and_batched(size: str) -> AsyncIterator[tuple[str, int, Any]]:
    """(label, rows, engine): the factory's qwen2 model of ``size`` loaded
    for one request at a time, then for a batch of four (no prefix cache:
    the repeated prompt would be served from it)."""
    from mlxd.engine.loader import load_text_engine
    from mlxd.engine.worker import MlxWorker
    from mlxd.factory import ModelRecipe, build_model
    from mlxd.registry.model import ModelSpec, PrefixCacheSpec

    path = build_model(ModelRecipe(arch="qwen2", size=size))
    worker = MlxWorker().start()
    no_cache = PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False)
    try:
        for label, concurrency, rows in (("single", 1, 1), ("batch_of_4", 4, 4)):
            spec = ModelSpec(name=f"{size}-{label}", path=path, source=str(path), max_context=8192,
                             max_concurrency=concurrency, prefix_cache=no_cache)
            engine = await load_text_engine(spec, worker)
            try:
                yield label, rows, engine
            finally:
                await engine.close()
    finally:
        await worker.shutdown()
