"""Many clients, one model; and many models, room for one.

1. Aggregate decode tokens/s for 1, 2, 4 and 8 concurrent streaming clients
   on one model (continuous batching, max_concurrency 8). Target (issue #8):
   4 clients >= 2x the single-client aggregate. Each figure is the median of
   --rounds rounds (other processes share the cores); with --serial the same
   clients also go to a max_concurrency 1 copy of the model, one after another.
2. The workload A B A A C A B C (all queued at once) under a budget that holds
   one model: how many loads it costs. Grouping by model: 3, not 7.

    python bench/concurrency.py --size small --serial
    python bench/concurrency.py --size bench --tokens 32 --rounds 1

Prints tables and merges the figures into bench/results/concurrency.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, add_dtype_option, daemon, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402


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


def one_round(url: str, model: str, clients: int, tokens: int) -> tuple[int, float]:
    results: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=stream_once, args=(url, model, tokens, results)) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r[2] for r in results), time.perf_counter() - started


def engine_figures(url: str, model: str) -> dict[str, Any]:
    status = httpx.get(f"{url}/v1/status", timeout=30).json()
    engine = next(m for m in status["models"] if m["name"] == model).get("engine") or {}
    return {k: engine.get(k) for k in ("batching", "batched_steps", "tokens_generated")}


def aggregate(url: str, model: str, clients: int, tokens: int, rounds: int) -> dict[str, Any]:
    """The median round's aggregate tokens/s, and how many decode steps it took."""
    load_before = os.getloadavg()[0]
    before = engine_figures(url, model)
    measured = [one_round(url, model, clients, tokens) for _ in range(rounds)]
    after = engine_figures(url, model)
    total, wall = sorted(measured, key=lambda m: m[0] / m[1])[len(measured) // 2]
    steps = None
    if after["batching"]:
        steps = round((after["batched_steps"] - before["batched_steps"]) / rounds)
    return {
        "clients": clients, "tokens": total, "seconds": round(wall, 2), "aggregate_tok_s": round(total / wall, 1),
        "rounds_tok_s": [round(t / w, 1) for t, w in measured], "batched_steps_per_round": steps,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


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
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure; the median is reported")
    parser.add_argument("--serial", action="store_true", help="also measure a max_concurrency 1 copy")
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    tokens = args.tokens or {"tiny": 256, "small": 128, "bench": 32}[args.size]

    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size, dtype=model_dtype(args)))
    entry = {"name": "m", "path": str(path), "preload": True, "max_concurrency": 8, "max_context": 4096,
             "idle_unload_seconds": 0}
    entries = [entry, {**entry, "name": "serial", "max_concurrency": 1}] if args.serial else [entry]
    rows = []
    serial: dict[int, float] = {}
    with daemon(entries) as url:
        for name in ("m", "serial") if args.serial else ("m",):
            stream_once(url, name, 8, [])  # warm-up
        for clients in (1, 2, 4, 8):
            rows.append(aggregate(url, "m", clients, tokens, args.rounds))
            if args.serial:
                serial[clients] = aggregate(url, "serial", clients, tokens, args.rounds)["aggregate_tok_s"]
    base = rows[0]["aggregate_tok_s"]
    for row in rows:
        row["speedup"] = round(row["aggregate_tok_s"] / base, 2)
        row["serial_tok_s"] = serial.get(row["clients"])

    tiny = [build_model(ModelRecipe("qwen2", "tiny", seed=s)) for s in (0, 1, 2)]
    entries = [{"name": n, "path": str(p), "max_concurrency": 8, "estimated_memory_gb": 0.01}
               for n, p in zip("ABC", tiny)]
    with daemon(entries, manager={"memory_budget": "15MB", "contention_policy": {"strategy": "wait"}}) as url:
        loads = grouped_swaps(url, "ABAACABC")

    result = {"size": args.size, "tokens_per_client": tokens, "rounds": args.rounds, "clients": rows,
              "grouping": {"order": "ABAACABC", "loads": loads, "naive_swaps": 7}, **environment()}
    print(f"\nqwen2-{args.size}, {tokens} tokens per client, BLAS {result['blas']}")
    print(table(["clients", "tokens", "seconds", "aggregate tok/s", "vs 1 client", "decode steps", "serial tok/s",
                 "load avg"],
                [[r["clients"], r["tokens"], r["seconds"], r["aggregate_tok_s"], r["speedup"],
                  r["batched_steps_per_round"], r["serial_tok_s"] or "-", "/".join(map(str, r["load_average"]))]
                 for r in rows]))
    print(f"target: 4 clients >= 2x one client -> {rows[2]['speedup']}x\n")
    print(f"A B A A C A B C with room for one model: {loads} loads (one per model is 3; swapping per request is 7)")
    print(f"wrote {save('concurrency', f'qwen2-{args.size}', result)}")


if __name__ == "__main__":
    main()
