"""Memory over many load/unload cycles of a tiny model through the engine loader.

    python bench/load_cycles.py --cycles 300
    python bench/load_cycles.py --cycles 300 --no-generate --tracemalloc

Each cycle loads the model with ``load_text_engine`` (what the daemon's
factory calls), optionally answers one short request, and closes the engine
(the daemon's unload). After every cycle it records the process RSS, MLX's
active memory and the number of live Python objects; a daemon lives for
weeks, so what matters is the growth per cycle once the first cycles have
warmed the caches up (the slope over the second half of the run).

Prints a table and merges the figures into bench/results/load_cycles.json
(keyed by ``--label``, e.g. "before" / "after" a fix).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, save, table  # noqa: E402


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


def slope(points: list[tuple[int, int]]) -> float:
    """Least-squares bytes per cycle."""
    n = len(points)
    if n < 2:
        return 0.0
    mx_ = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx_) ** 2 for x, _ in points)
    return sum((x - mx_) * (y - my) for x, y in points) / den if den else 0.0


async def cycles(path: Path, n: int, generate: bool, trace: bool) -> dict[str, Any]:
    from mlxd.engine import memory
    from mlxd.engine.loader import load_text_engine
    from mlxd.engine.types import GenerationRequest, SamplingParams
    from mlxd.engine.worker import MlxWorker
    from mlxd.registry.model import ModelSpec

    spec = ModelSpec(name="tiny", path=path, source=str(path))
    worker = MlxWorker().start()
    samples: list[dict[str, int]] = []
    snapshot = None
    try:
        for i in range(n):
            engine = await load_text_engine(spec, worker)
            if generate:
                request = GenerationRequest(
                    request_id=f"r{i}", max_tokens=4, prompt="def parse(argv):",
                    sampling=SamplingParams(temperature=0.0),
                )
                async for _ in engine.generate(request):
                    pass
            await engine.close()
            del engine
            gc.collect()
            if trace and i == n // 2:
                snapshot = tracemalloc.take_snapshot()
            samples.append({
                "cycle": i + 1,
                "rss": rss_bytes(),
                "mlx_active": await worker.call(memory.active_bytes),
                "objects": len(gc.get_objects()),
            })
        top: list[str] = []
        if trace and snapshot is not None:
            stats = tracemalloc.take_snapshot().compare_to(snapshot, "traceback")
            for stat in stats[:8]:
                top.append(f"{stat.size_diff / 1024:+.1f} KiB {stat.count_diff:+d} objs "
                           + " <- ".join(str(f) for f in stat.traceback[-3:]))
    finally:
        await worker.shutdown()
    half = samples[len(samples) // 2 :]
    return {
        "cycles": n,
        "generate": generate,
        "rss_first_mb": round(samples[0]["rss"] / 2**20, 1),
        "rss_last_mb": round(samples[-1]["rss"] / 2**20, 1),
        "rss_kb_per_cycle": round(slope([(s["cycle"], s["rss"]) for s in half]) / 1024, 2),
        "objects_per_cycle": round(slope([(s["cycle"], s["objects"]) for s in half]), 2),
        "mlx_active_last": samples[-1]["mlx_active"],
        "tracemalloc_top": top,
        "samples": samples[:: max(1, n // 30)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--arch", default="qwen2")
    parser.add_argument("--no-generate", action="store_true")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--label", default="current")
    args = parser.parse_args()

    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe(arch=args.arch, size="tiny"))
    if args.tracemalloc:
        tracemalloc.start(12)
    started = time.perf_counter()
    result = asyncio.run(cycles(path, args.cycles, not args.no_generate, args.tracemalloc))
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["environment"] = environment()
    rows = [[s["cycle"], f"{s['rss'] / 2**20:.1f}", s["mlx_active"], s["objects"]] for s in result["samples"]]
    print(table(["cycle", "RSS MB", "MLX active", "py objects"], rows))
    print(f"\nRSS {result['rss_first_mb']} -> {result['rss_last_mb']} MB over {args.cycles} cycles; "
          f"slope over the second half: {result['rss_kb_per_cycle']} KB/cycle, "
          f"{result['objects_per_cycle']} Python objects/cycle")
    for line in result["tracemalloc_top"]:
        print("  ", line)
    path_out = save("load_cycles", args.label, result)
    print(f"wrote {path_out}")


if __name__ == "__main__":
    main()
