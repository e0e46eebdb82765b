"""What a front mlxd adds in front of a remote backend: time to first token
and streamed decode through a front `mlxd serve` whose entry is served by a
backend `mlxd serve`, against asking the backend directly: same model, same
prompt, greedy, the same number of tokens, in one run.

    python bench/remote.py                          # tiny model, 12 pairs: about a minute
    python bench/remote.py --size small --repeats 20 --tokens 128
    python bench/remote.py --size small --placement apart

Made to survive a shared, noisy machine. Each repeat is a pair: one request
straight to the backend and one through the front, back to back, the order
alternating from pair to pair, so a burst of other load falls on both sides
alike. The figures are medians over the pairs of each pair's own difference
(front - direct time to first token) and ratio (front / direct decode
rate), with their interquartile range as the spread. The front's CPU time
per relayed token (its process, from psutil) is reported beside them: CPU
time barely moves when other jobs share the cores, so it is the relay's
own cost however noisy the wall clock is.

Both daemons run on this machine (loopback). ``--placement shared`` (the
default) lets every process use every core, so the front's work competes
with the backend's decode for them. ``--placement apart`` is a laptop in
front of a studio on one machine: the backend gets the last core (or the
upper half of them) to itself, the front and the client the rest, as the
apps and the front share the laptop and the backend has the studio. The
direct runs use the same placement, so both sides decode on the same
cores. Targets (issue #15): under 5 ms added time to first token, decode
>= 0.98 of direct. Prints a table and merges the figures into
bench/results/remote.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import add_dtype_option, daemon, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402
from bench.overhead import run_daemon  # noqa: E402


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def stream(http: httpx.Client, tokens: int) -> dict[str, float]:
    """One streamed completion (overhead.py's measure): time to its first
    text, decode rate between the first and the last text, tokens made."""
    run = run_daemon(http, tokens)
    return {"ttft_ms": run["ttft_s"] * 1000, "decode_tok_s": run["decode_tok_s"], "tokens": run["tokens"]}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def summary(values: list[float], digits: int) -> dict[str, float]:
    q1, median, q3 = quartiles(values)
    return {"median": round(median, digits), "q1": round(q1, digits), "q3": round(q3, digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def spread(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']}{unit} (IQR {s['q1']}..{s['q3']})"


def placement(kind: str) -> tuple[set[int] | None, set[int] | None]:
    """(the backend's cores, the front's and this client's cores); None: all."""
    if kind == "shared":
        return None, None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--placement apart needs at least two cores")
    half = max(1, len(cores) // 2)
    return set(cores[half:]), set(cores[:half])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny",
                        help="size of the factory's Qwen2-shaped model")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per request (default: by size)")
    parser.add_argument("--repeats", type=int, default=12, help="interleaved pairs (at least 10)")
    parser.add_argument("--placement", choices=["shared", "apart"], default="shared",
                        help="shared: every process on every core; apart: the backend on cores of its own")
    add_dtype_option(parser)
    args = parser.parse_args()
    if args.repeats < 10:
        parser.error("--repeats must be at least 10: fewer pairs make no median worth quoting on a shared machine")
    reexec_with_openblas()
    backend_cpus, front_cpus = placement(args.placement)
    if front_cpus:
        os.sched_setaffinity(0, front_cpus)  # this client; the front inherits it
    tokens = args.tokens or {"tiny": 256, "small": 128, "bench": 48}[args.size]

    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size, dtype=model_dtype(args)))
    # No prefix cache: a repeated prompt would be served from it.
    entry = {"name": "m", "path": str(path), "preload": True, "max_context": 32768, "idle_unload_seconds": 0,
             "prefix_cache": {"max_bytes": 0, "persist": False}}
    pairs: list[dict[str, Any]] = []
    with daemon([entry], cpus=backend_cpus) as backend_url:
        backends = {"studio": {"url": backend_url + "/v1", "kind": "mlxd"}}
        with daemon([{"name": "m", "backend": "studio"}], backends=backends) as front_url, \
                httpx.Client(base_url=backend_url, timeout=600) as direct, \
                httpx.Client(base_url=front_url, timeout=600) as front:
            front_pid = front.get("/v1/status").json()["daemon"]["pid"]
            for http in (direct, front, direct, front):  # warm-up: kernels, connections
                stream(http, 16)
            for i in range(args.repeats):
                order = [("direct", direct), ("front", front)]
                pair: dict[str, Any] = {}
                for side, http in order if i % 2 == 0 else order[::-1]:
                    cpu = cpu_seconds(front_pid)
                    pair[side] = stream(http, tokens)
                    pair[side]["front_cpu_s"] = cpu_seconds(front_pid) - cpu
                pairs.append(pair)

    added = [p["front"]["ttft_ms"] - p["direct"]["ttft_ms"] for p in pairs]
    ratio = [p["front"]["decode_tok_s"] / p["direct"]["decode_tok_s"] for p in pairs]
    relay_us = [p["front"]["front_cpu_s"] / p["front"]["tokens"] * 1e6 for p in pairs]
    idle_us = [p["direct"]["front_cpu_s"] / p["direct"]["tokens"] * 1e6 for p in pairs]

    def side(name: str) -> dict[str, dict[str, float]]:
        return {"ttft_ms": summary([p[name]["ttft_ms"] for p in pairs], 2),
                "decode_tok_s": summary([p[name]["decode_tok_s"] for p in pairs], 1)}

    result = {
        "size": args.size, "tokens": tokens, "pairs": args.repeats, "placement": args.placement,
        "backend_cpus": sorted(backend_cpus or os.sched_getaffinity(0)),
        "front_cpus": sorted(front_cpus or os.sched_getaffinity(0)),
        "direct": side("direct"), "front": side("front"),
        "ttft_added_ms": summary(added, 2),
        "decode_ratio": summary(ratio, 3),
        # The front's CPU per token while it relays, and while it sits idle
        # (the direct runs: its background poll and timers), for comparison.
        # psutil's CPU times tick every 10 ms: the whole run's total over its
        # tokens is the precise figure, the per-pair ones show the spread.
        "front_cpu_us_per_token": round(sum(p["front"]["front_cpu_s"] for p in pairs)
                                        / sum(p["front"]["tokens"] for p in pairs) * 1e6, 1),
        "front_cpu_us_per_token_pairs": summary(relay_us, 1),
        "front_idle_cpu_us_per_token": round(sum(p["direct"]["front_cpu_s"] for p in pairs)
                                             / sum(p["direct"]["tokens"] for p in pairs) * 1e6, 1),
        "runs": [{k: {m: round(v, 3) for m, v in p[k].items()} for k in ("direct", "front")} for p in pairs],
        **environment(),
    }
    print(f"\nqwen2-{args.size}: {tokens} tokens, {args.repeats} interleaved pairs, BLAS {result['blas']}, "
          f"load average {result['load_average']:.1f}, placement {args.placement} (backend on cores "
          f"{result['backend_cpus']}, front and client on {result['front_cpus']})")
    print(table(
        ["path", "first text ms (median, IQR)", "decode tok/s (median, IQR)"],
        [["backend mlxd, directly", spread(result["direct"]["ttft_ms"]), spread(result["direct"]["decode_tok_s"])],
         ["through a front mlxd", spread(result["front"]["ttft_ms"]), spread(result["front"]["decode_tok_s"])]],
    ))
    print(f"per pair: added first-text {spread(result['ttft_added_ms'], ' ms')} (target < 5 ms); "
          f"front/direct decode {spread(result['decode_ratio'])} (target >= 0.98)")
    print(f"front CPU per relayed token: {result['front_cpu_us_per_token']} us over the run, per pair "
          f"{spread(result['front_cpu_us_per_token_pairs'], ' us')}; while idle: "
          f"{result['front_idle_cpu_us_per_token']} us")
    print(f"wrote {save('remote', f'qwen2-{args.size}-{args.placement}', result)}")


if __name__ == "__main__":
    main()
