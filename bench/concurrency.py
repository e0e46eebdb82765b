"""Many clients, one model; and many models, room for one.

1. Aggregate decode tokens/s for 1, 2, 4 and 8 concurrent streaming clients
   on one model (continuous batching). Target (issue #8): 4 clients >= 2x the
   single-client aggregate.
2. The workload A B A A C A B C (all queued at once) under a budget that holds
   one model: how many loads it costs. Grouping by model: 3, not 7.

    python bench/concurrency.py --size small
    python bench/concurrency.py --size bench --tokens 32

Prints tables and merges the figures into bench/results/concurrency.json.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, daemon, environment, reexec_with_openblas, save, table  # noqa: E402


def stream_once(url: str, model: str, tokens: int, out: list[tuple[float, float, int]]) -> None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0.7, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    first = last = None
    generated = 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            if '"text":""' not in line:
                first = first or now
                last = now
            if '"usage"' in line and '"choices":[]' in line:
                generated = int(line.split('"completion_tokens":')[1].split(",")[0])
    out.append((first or 0.0, last or 0.0, generated))


def aggregate(url: str, model: str, clients: int, tokens: int) -> dict[str, Any]:
    results: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=stream_once, args=(url, model, tokens, results)) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    total = sum(r[2] for r in results)
    return {"clients": clients, "tokens": total, "seconds": round(wall, 2), "aggregate_tok_s": round(total / wall, 1)}


def grouped_swaps(url: str, order: str) -> int:
    threads = []
    for model in order:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        t = threading.Thread(target=lambda b=body: httpx.post(f"{url}/v1/completions", json=b, timeout=900))
        threads.append(t)
        t.start()
        time.sleep(0.01)  # arrival order as written
    for t in threads:
        t.join()
    events = httpx.get(f"{url}/v1/status").json()["events"]
    return sum(1 for e in events if e["kind"] == "load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="small")
    parser.add_argument("--tokens", type=int, default=None)
    args = parser.parse_args()
    reexec_with_openblas()
    tokens = args.tokens or {"tiny": 256, "small": 128, "bench": 32}[args.size]

    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size))
    entry = {"name": "m", "path": str(path), "preload": True, "max_concurrency": 8, "max_context": 4096,
             "idle_unload_seconds": 0}
    rows = []
    with daemon([entry]) as url:
        stream_once(url, "m", 8, [])  # warm-up
        for clients in (1, 2, 4, 8):
            rows.append(aggregate(url, "m", clients, tokens))
    base = rows[0]["aggregate_tok_s"]
    for row in rows:
        row["speedup"] = round(row["aggregate_tok_s"] / base, 2)

    tiny = [build_model(ModelRecipe("qwen2", "tiny", seed=s)) for s in (0, 1, 2)]
    entries = [{"name": n, "path": str(p), "max_concurrency": 8, "estimated_memory_gb": 0.01}
               for n, p in zip("ABC", tiny)]
    with daemon(entries, manager={"memory_budget": "15MB", "contention_policy": {"strategy": "wait"}}) as url:
        loads = grouped_swaps(url, "ABAACABC")

    result = {"size": args.size, "tokens_per_client": tokens, "clients": rows,
              "grouping": {"order": "ABAACABC", "loads": loads, "naive_swaps": 7}, **environment()}
    print(f"\nqwen2-{args.size}, {tokens} tokens per client, BLAS {result['blas']}")
    print(table(["clients", "tokens", "seconds", "aggregate tok/s", "vs 1 client"],
                [[r["clients"], r["tokens"], r["seconds"], r["aggregate_tok_s"], r["speedup"]] for r in rows]))
    print(f"target: 4 clients >= 2x one client -> {rows[2]['speedup']}x\n")
    print(f"A B A A C A B C with room for one model: {loads} loads (one per model is 3; swapping per request is 7)")
    print(f"wrote {save('concurrency', f'qwen2-{args.size}', result)}")


if __name__ == "__main__":
    main()
