"""What the engine layer costs: TextEngine vs calling mlx_lm.stream_generate directly.

Same model folder, same prompt, greedy, in one process. The direct path runs
``stream_generate`` on the main thread; the engine path runs through the
MlxWorker thread, the stop-string matcher and the asyncio hand-off, exactly
as the daemon does. Runs alternate (direct, engine, direct, ...) after a
warm-up, and the medians are reported.

    python bench/engine_overhead.py --size tiny
    python bench/engine_overhead.py --size small --max-tokens 256 --repeats 5

Prints a table and merges the figures into bench/results/engine_overhead.json
(one entry per size). Timing only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PROMPT, ROOT, add_dtype_option, environment, model_dtype, reexec_with_openblas, save  # noqa: E402


@dataclass
class Run:
    ttft_s: float
    decode_tok_s: float
    tokens: int
    text: str


def measure(chunks_with_times: list[tuple[float, int, str]], started: float) -> Run:
    """From (arrival time, tokens so far, text) of each chunk with text."""
    first_t, first_n, _ = chunks_with_times[0]
    last_t, last_n, _ = chunks_with_times[-1]
    decode = (last_n - first_n) / (last_t - first_t) if last_t > first_t else float("nan")
    text = "".join(t for _, _, t in chunks_with_times)
    return Run(ttft_s=first_t - started, decode_tok_s=decode, tokens=last_n, text=text)


def run_direct(model: Any, tokenizer: Any, max_tokens: int) -> Run:
    import mlx_lm

    seen: list[tuple[float, int, str]] = []
    started = time.perf_counter()
    # The prompt as text, so both paths pay for tokenizing it.
    for response in mlx_lm.stream_generate(model, tokenizer, PROMPT, max_tokens=max_tokens):
        if response.text or response.finish_reason:
            seen.append((time.perf_counter(), response.generation_tokens, response.text))
    return measure(seen, started)


async def run_engine(engine: Any, max_tokens: int) -> Run:
    from mlxd.engine.types import GenerationRequest, SamplingParams

    request = GenerationRequest(
        request_id="bench",
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=0.0),
        prompt=PROMPT,
    )
    seen: list[tuple[float, int, str]] = []
    started = time.perf_counter()
    async for chunk in engine.generate(request):
        if chunk.completion_tokens:  # not the acceptance, which comes before the prefill
            seen.append((time.perf_counter(), chunk.completion_tokens, chunk.text))
    return measure(seen, started)


async def handoff_cost_us(items: int = 50_000) -> float:
    """The worker's own cost per item: step, hand-off to the loop, consumer wake-up."""
    from mlxd.engine.types import GenerationChunk
    from mlxd.engine.worker import MlxWorker

    worker = MlxWorker().start()
    try:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            make = lambda: (GenerationChunk(text="x", completion_tokens=i) for i in range(items))  # noqa: E731
            async for _ in worker.stream(make):
                pass
            best = min(best, (time.perf_counter() - started) / items)
    finally:
        await worker.shutdown()
    return round(best * 1e6, 2)


async def bench(size: str, arch: str, max_tokens: int, repeats: int, dtype: str = "float32") -> dict[str, Any]:
    import mlx_lm

    from mlxd.engine.loader import load_text_engine
    from mlxd.engine.worker import MlxWorker
    from mlxd.factory import ModelRecipe, build_model
    from mlxd.registry.model import ModelSpec, PrefixCacheSpec

    path = build_model(ModelRecipe(arch=arch, size=size, dtype=dtype))
    model, tokenizer = mlx_lm.load(str(path))
    prompt_tokens = len(tokenizer.encode(PROMPT))

    worker = MlxWorker().start()
    # No prefix cache: the runs repeat one prompt, which it would serve.
    spec = ModelSpec(
        name=f"{arch}-{size}", path=path, source=str(path), max_context=32768,
        prefix_cache=PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False),
    )
    engine = await load_text_engine(spec, worker)
    paths = {
        # Plain mlx-lm on the main thread, as a user's script would call it.
        "direct": lambda n: asyncio.sleep(0, run_direct(model, tokenizer, n)),
        # Plain mlx-lm as one call on the worker thread: same thread as the engine,
        # so the difference to "engine" is the engine's own per-token cost.
        "direct_on_worker": lambda n: worker.call(run_direct, model, tokenizer, n),
        "engine": lambda n: run_engine(engine, n),
    }
    runs: dict[str, list[Run]] = {name: [] for name in paths}
    try:
        # Warm-up: MLX JIT-compiles CPU kernels on first use.
        for go in paths.values():
            await go(min(max_tokens, 16))
        for _ in range(repeats):
            for name, go in paths.items():
                runs[name].append(await go(max_tokens))
    finally:
        await engine.close()
        await worker.shutdown()

    texts = {r.text for rs in runs.values() for r in rs}

    def summary(rs: list[Run]) -> dict[str, float]:
        rates = [r.decode_tok_s for r in rs]
        return {
            "ttft_ms": round(statistics.median(r.ttft_s for r in rs) * 1000, 2),
            "decode_tok_s": round(statistics.median(rates), 1),
            "decode_tok_s_min": round(min(rates), 1),
            "decode_tok_s_max": round(max(rates), 1),
            "tokens": rs[0].tokens,
        }

    summaries = {name: summary(rs) for name, rs in runs.items()}
    d, w, e = summaries["direct"], summaries["direct_on_worker"], summaries["engine"]
    return {
        "size": size,
        "arch": arch,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "repeats": repeats,
        **summaries,
        "decode_ratio_vs_direct": round(e["decode_tok_s"] / d["decode_tok_s"], 3),
        "decode_ratio_vs_direct_on_worker": round(e["decode_tok_s"] / w["decode_tok_s"], 3),
        "ttft_overhead_ms": round(e["ttft_ms"] - d["ttft_ms"], 2),
        "identical_text": len(texts) == 1,
        "worker_handoff_us_per_item": await handoff_cost_us(),
        "decode_tok_s_runs": {name: [round(r.decode_tok_s, 1) for r in rs] for name, rs in runs.items()},
        **environment(),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['arch']}-{result['size']}: prompt {result['prompt_tokens']} tokens, "
        f"{result['engine']['tokens']} generated, median of {result['repeats']}, "
        f"BLAS: {result['blas']}"
    )
    print(f"{'path':<34}{'TTFT ms':>9}{'decode tok/s':>14}{'min-max':>16}")
    labels = {
        "direct": "mlx_lm.stream_generate (main)",
        "direct_on_worker": "mlx_lm.stream_generate (worker)",
        "engine": "TextEngine.generate",
    }
    for name, label in labels.items():
        row = result[name]
        spread = f"{row['decode_tok_s_min']:.0f}-{row['decode_tok_s_max']:.0f}"
        print(f"{label:<34}{row['ttft_ms']:>9.2f}{row['decode_tok_s']:>14.1f}{spread:>16}")
    print(
        f"engine/direct decode: {result['decode_ratio_vs_direct']:.3f}  "
        f"engine/direct-on-worker: {result['decode_ratio_vs_direct_on_worker']:.3f}  "
        f"TTFT overhead: {result['ttft_overhead_ms']:+.2f} ms  "
        f"same text: {result['identical_text']}"
    )
    print(f"worker hand-off alone (no model): {result['worker_handoff_us_per_item']:.1f} us per chunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    max_tokens = args.max_tokens or {"tiny": 256, "small": 256, "bench": 64}[args.size]
    repeats = args.repeats or {"tiny": 7, "small": 5, "bench": 3}[args.size]
    result = asyncio.run(bench(args.size, args.arch, max_tokens, repeats, model_dtype(args)))
    print_table(result)
    path = save("engine_overhead", f"{result['arch']}-{result['size']}", result)
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
