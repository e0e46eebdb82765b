"""Residency costs: cold load through the daemon vs mlx_lm.load alone, swap
latency under a budget that holds one model, and the footprint estimate vs
what was measured.

    python bench/residency.py --size small
    python bench/residency.py --size bench --repeats 3

Targets (issue #3): cold load <= 1.15x mlx_lm.load; estimate within 10 % of
the measured footprint. The footprint run fills the whole context once
(max_context tokens, one sequence, no prefix-cache allowance) so the
measurement covers what the estimate covers: weights plus a full KV cache.
Prints tables and merges the figures into bench/results/residency.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, add_dtype_option, daemon, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402

CONTEXT = 1024


def direct_load_seconds(path: Path) -> float:
    import gc

    import mlx.core as mx
    import mlx_lm

    started = time.perf_counter()
    model, tokenizer = mlx_lm.load(str(path))
    mx.eval(model.parameters())
    seconds = time.perf_counter() - started
    del model, tokenizer
    gc.collect()
    mx.clear_cache()
    return seconds


def daemon_load_seconds(http: httpx.Client, name: str) -> float:
    started = time.perf_counter()
    http.post(f"/v1/models/{name}/load", json={}).raise_for_status()
    seconds = time.perf_counter() - started
    http.post(f"/v1/models/{name}/unload", json={}).raise_for_status()
    return seconds


def ask(http: httpx.Client, name: str, max_tokens: int = 1, **kw: Any) -> float:
    started = time.perf_counter()
    r = http.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": max_tokens,
                                            "temperature": 0, **kw})
    r.raise_for_status()
    return time.perf_counter() - started


def model_status(http: httpx.Client, name: str) -> dict[str, Any]:
    return next(m for m in http.get("/v1/status").json()["models"] if m["name"] == name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="small")
    parser.add_argument("--repeats", type=int, default=5)
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()

    from mlxd.factory import ModelRecipe, build_model

    paths = [build_model(ModelRecipe("qwen2", args.size, seed=s, dtype=model_dtype(args))) for s in (0, 1)]
    common = {"max_context": CONTEXT, "max_concurrency": 1, "idle_unload_seconds": 0,
              "prefix_cache": {"max_bytes": 0, "persist": False}}
    entries = [{"name": f"m{i}", "path": str(p), **common} for i, p in enumerate(paths)]

    direct_load_seconds(paths[0])  # warm the page cache for both sides alike
    loads: dict[str, list[float]] = {"direct": [], "daemon": []}
    with daemon(entries) as url, httpx.Client(base_url=url, timeout=600) as http:
        for _ in range(args.repeats):
            loads["direct"].append(direct_load_seconds(paths[0]))
            loads["daemon"].append(daemon_load_seconds(http, "m0"))
        # Footprint: fill the context once, then compare.
        footprints = []
        for entry in entries:
            ask(http, entry["name"], max_tokens=CONTEXT, ignore_eos=True)
            status = model_status(http, entry["name"])
            memory = status["memory"]
            footprints.append({
                "model": entry["name"],
                "estimated_bytes": memory["estimated_bytes"],
                "measured_bytes": memory["measured_bytes"],
                "ratio": round(memory["measured_bytes"] / memory["estimated_bytes"], 3),
            })
            http.post(f"/v1/models/{entry['name']}/unload", json={}).raise_for_status()
    # Swaps: a budget that holds one model; alternate requests force a swap each time.
    budget = int(max(f["estimated_bytes"] for f in footprints) * 1.5)
    swaps: list[float] = []
    same: list[float] = []
    with daemon(entries, manager={"memory_budget": budget}) as url, httpx.Client(base_url=url, timeout=600) as http:
        ask(http, "m0")
        for i in range(args.repeats):
            swaps.append(ask(http, f"m{(i + 1) % 2}"))
            same.append(ask(http, f"m{(i + 1) % 2}"))
        evictions = sum(1 for e in http.get("/v1/status").json()["events"] if e["kind"] == "evict")

    med = {k: statistics.median(v) for k, v in loads.items()}
    result = {
        "size": args.size,
        "repeats": args.repeats,
        "cold_load_s": {k: round(v, 3) for k, v in med.items()},
        "cold_load_ratio": round(med["daemon"] / med["direct"], 3),
        "swap_request_s": round(statistics.median(swaps), 3),
        "resident_request_s": round(statistics.median(same), 3),
        "evictions": evictions,
        "footprints": footprints,
        **environment(),
    }
    print(f"\nqwen2-{args.size}, median of {args.repeats}, BLAS {result['blas']}")
    print(table(["cold load", "seconds"], [["mlx_lm.load", med["direct"]], ["daemon (admin load)", med["daemon"]]]))
    print(f"daemon/direct: {result['cold_load_ratio']:.3f} (target <= 1.15)\n")
    print(table(["request (1 token)", "seconds"],
                [["needs a swap", result["swap_request_s"]], ["model resident", result["resident_request_s"]]]))
    print(f"evictions seen: {evictions}\n")
    print(table(["model", "estimated MB", "measured MB", "measured/estimated"],
                [[f["model"], round(f["estimated_bytes"] / 2**20, 1), round(f["measured_bytes"] / 2**20, 1),
                  f["ratio"]] for f in footprints]))
    print(f"wrote {save('residency', f'qwen2-{args.size}', result)}")


if __name__ == "__main__":
    main()
