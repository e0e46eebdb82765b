"""What a front mlxd adds in front of a remote backend: time to first token
and streamed decode through a front `mlxd serve` whose entry is served by a
backend `mlxd serve`, versus asking the backend directly, same model, same
prompt, greedy, same number of tokens, in one run.

    python bench/remote.py --size tiny
    python bench/remote.py --size small --tokens 256 --repeats 7

Both daemons are processes on this machine (loopback), so the front's work
competes with the backend's decode for the same cores: on a laptop in front
of a studio it runs on another machine. Runs alternate (direct, front, ...)
after a warm-up; medians are reported. Targets (issue #15): under 5 ms added
time to first token, decode >= 0.98 of direct. Prints a table and merges the
figures into bench/results/remote.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import daemon, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.overhead import PROMPT, run_daemon  # noqa: E402


def first_token(http: httpx.Client) -> float:
    import time

    started = time.perf_counter()
    http.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
              ).raise_for_status()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    reexec_with_openblas()
    tokens = args.tokens or {"tiny": 512, "small": 256, "bench": 64}[args.size]
    repeats = args.repeats or {"tiny": 9, "small": 7, "bench": 3}[args.size]

    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size))
    # No prefix cache: a repeated prompt would be served from it and flatter the TTFT.
    entry = {"name": "m", "path": str(path), "preload": True, "max_context": 32768, "idle_unload_seconds": 0,
             "prefix_cache": {"max_bytes": 0, "persist": False}}
    runs: dict[str, list[dict[str, float]]] = {"direct": [], "front": []}
    first: dict[str, list[float]] = {"direct": [], "front": []}
    with daemon([entry]) as backend_url:
        backends = {"studio": {"url": backend_url + "/v1", "kind": "mlxd"}}
        with daemon([{"name": "m", "backend": "studio"}], backends=backends) as front_url, \
                httpx.Client(base_url=backend_url, timeout=600) as direct, \
                httpx.Client(base_url=front_url, timeout=600) as front:
            for http in (direct, front):  # warm-up: kernels, connections
                run_daemon(http, 16)
                first_token(http)
            for _ in range(repeats):
                runs["direct"].append(run_daemon(direct, tokens))
                runs["front"].append(run_daemon(front, tokens))
                first["direct"].append(first_token(direct))
                first["front"].append(first_token(front))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    result = {
        "size": args.size,
        "tokens": tokens,
        "repeats": repeats,
        "direct": {"first_token_ms": round(statistics.median(first["direct"]) * 1000, 2),
                   "first_text_ms": round(median("direct", "ttft_s") * 1000, 2),
                   "decode_tok_s": round(median("direct", "decode_tok_s"), 1)},
        "front": {"first_token_ms": round(statistics.median(first["front"]) * 1000, 2),
                  "first_text_ms": round(median("front", "ttft_s") * 1000, 2),
                  "decode_tok_s": round(median("front", "decode_tok_s"), 1)},
        "runs": {k: [round(r["decode_tok_s"], 1) for r in v] for k, v in runs.items()},
        **environment(),
    }
    result["decode_ratio"] = round(result["front"]["decode_tok_s"] / result["direct"]["decode_tok_s"], 3)
    result["ttft_added_ms"] = round(result["front"]["first_token_ms"] - result["direct"]["first_token_ms"], 2)
    result["first_text_added_ms"] = round(result["front"]["first_text_ms"] - result["direct"]["first_text_ms"], 2)
    print(f"\nqwen2-{args.size}: {tokens} tokens, median of {repeats}, BLAS {result['blas']}")
    print(table(
        ["path", "first token ms", "first streamed text ms", "decode tok/s"],
        [["backend mlxd, directly", result["direct"]["first_token_ms"], result["direct"]["first_text_ms"],
          result["direct"]["decode_tok_s"]],
         ["through a front mlxd", result["front"]["first_token_ms"], result["front"]["first_text_ms"],
          result["front"]["decode_tok_s"]]],
    ))
    print(f"front/direct decode: {result['decode_ratio']:.3f} (target >= 0.98); "
          f"added TTFT: {result['ttft_added_ms']:+.2f} ms (target < 5)")
    print(f"wrote {save('remote', f'qwen2-{args.size}', result)}")


if __name__ == "__main__":
    main()
