"""What logit_bias costs per token: decode tok/s of biased requests / unbiased ones.

Engine level (TextEngine on the MlxWorker, as the daemon runs it), greedy,
the same number of tokens either way (both decode past EOS, ``ignore_eos``).
The biased requests carry ``--entries`` biases (small ones, from -5 to 5, so
the text stays the model's own kind of text), which mlxd adds as one
vector over the vocabulary per step. Runs alternate after a warm-up; the
best run of each is reported (the machine is shared: slow runs measure the
neighbours), with the ratio of medians and the CPU time per token beside it.

- single: one request at a time (``max_concurrency: 1``, stream_generate);
- batch of 4: four concurrent requests on a ``max_concurrency: 4`` engine
  (BatchGenerator), all biased / all unbiased; aggregate tok/s.

    python bench/logit_bias.py --size tiny
    python bench/logit_bias.py --size small --max-tokens 96 --repeats 3

Prints a table and merges the figures into bench/results/logit_bias.json
(one entry per size). Timing only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PROMPT, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.constrained import timed  # noqa: E402


def biases(entries: int, vocab_size: int) -> dict[int, float]:
    step = max(1, vocab_size // entries)
    return {token: float((i % 11) - 5) for i, token in enumerate(range(0, vocab_size, step)) if i < entries}


def request(rid: str, max_tokens: int, bias: dict[int, float] | None):
    from mlxd.engine.types import GenerationRequest, SamplingParams

    return GenerationRequest(request_id=rid, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0),
                             prompt=PROMPT, ignore_eos=True, logit_bias=bias)


async def decode_rate(engine: Any, rows: int, max_tokens: int, bias: dict[int, float] | None) -> tuple[float, float]:
    """Aggregate decode tok/s of ``rows`` concurrent requests (prefill
    excluded), and the process's CPU seconds per generated token."""
    cpu = time.process_time()
    results = await asyncio.gather(*(timed(engine, request(f"r{i}", max_tokens, bias)) for i in range(rows)))
    cpu = time.process_time() - cpu
    assert all(tokens == max_tokens for *_, tokens in results)
    start = max(first for first, _, _ in results)
    end = max(last for _, last, _ in results)
    generated = sum(tokens for *_, tokens in results) - rows
    return (generated / (end - start) if end > start else float("nan")), cpu / (rows * max_tokens)


async def compare(engine: Any, rows: int, max_tokens: int, repeats: int, bias: dict[int, float]) -> dict[str, Any]:
    await decode_rate(engine, rows, 16, bias)  # warm-up
    await decode_rate(engine, rows, 16, None)
    free, biased, free_cpu, biased_cpu = [], [], [], []
    for _ in range(repeats):
        rate, cpu = await decode_rate(engine, rows, max_tokens, None)
        free.append(rate)
        free_cpu.append(cpu)
        rate, cpu = await decode_rate(engine, rows, max_tokens, bias)
        biased.append(rate)
        biased_cpu.append(cpu)
    f, b = max(free), max(biased)
    fc, bc = statistics.median(free_cpu), statistics.median(biased_cpu)
    return {
        "rows": rows,
        "free_tok_s": round(f, 1),
        "biased_tok_s": round(b, 1),
        "ratio": round(b / f, 3),
        "ratio_of_medians": round(statistics.median(biased) / statistics.median(free), 3),
        "free_cpu_ms_per_token": round(fc * 1000, 3),
        "biased_cpu_ms_per_token": round(bc * 1000, 3),
        "free_runs": [round(x, 1) for x in free],
        "biased_runs": [round(x, 1) for x in biased],
    }


async def bench(size: str, max_tokens: int, repeats: int, entries: int) -> dict[str, Any]:
    from mlxd.engine.loader import load_text_engine
    from mlxd.engine.worker import MlxWorker
    from mlxd.factory import ModelRecipe, build_model
    from mlxd.registry.model import ModelSpec, PrefixCacheSpec

    path = build_model(ModelRecipe(arch="qwen2", size=size))
    worker = MlxWorker().start()
    no_cache = PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False)
    result: dict[str, Any] = {"size": size, "max_tokens": max_tokens, "repeats": repeats, "entries": entries}
    try:
        for label, concurrency, rows in (("single", 1, 1), ("batch_of_4", 4, 4)):
            spec = ModelSpec(name=f"{size}-{label}", path=path, source=str(path), max_context=8192,
                             max_concurrency=concurrency, prefix_cache=no_cache)
            engine = await load_text_engine(spec, worker)
            try:
                result["vocab_size"] = engine.vocab_size
                result[label] = await compare(engine, rows, max_tokens, repeats, biases(entries, engine.vocab_size))
            finally:
                await engine.close()
    finally:
        await worker.shutdown()
    result.update(environment())
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nqwen2-{result['size']} (vocabulary {result['vocab_size']}): {result['max_tokens']} tokens a request, "
        f"{result['entries']} biases, best of {result['repeats']}, BLAS: {result['blas']}, "
        f"load average {result['load_average']:.1f}"
    )
    rows = [
        [label, r["rows"], r["free_tok_s"], r["biased_tok_s"], f"{r['ratio']:.3f}", f"{r['ratio_of_medians']:.3f}",
         r["free_cpu_ms_per_token"], r["biased_cpu_ms_per_token"]]
        for label, r in (("single", result["single"]), ("batch of 4", result["batch_of_4"]))
    ]
    headers = ["run", "rows", "free tok/s", "biased tok/s", "ratio", "of medians", "free CPU ms/tok",
               "biased CPU ms/tok"]
    print(table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--entries", type=int, default=300, help="biased token ids per request")
    args = parser.parse_args()
    max_tokens = args.max_tokens or {"tiny": 128, "small": 96, "bench": 32}[args.size]
    repeats = args.repeats or {"tiny": 5, "small": 3, "bench": 2}[args.size]
    reexec_with_openblas()
    result = asyncio.run(bench(args.size, max_tokens, repeats, args.entries))
    print_table(result)
    print(f"saved to {save('logit_bias', args.size, result)}")


if __name__ == "__main__":
    main()
