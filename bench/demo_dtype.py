"""What the demo's default model costs in each dtype the demo can serve it in:
SmolLM2-135M-Instruct as its GGUF file's Q4_1 (what a bf16 device's demo
registry names) and dequantized to float32 (what `mlxd demo` imports on a
Linux CPU), each through a real `mlxd serve` on a demo registry.

For each variant and round, a fresh daemon:
1. the README's curl (`default`, "Hello", 20 tokens), timed from the request
   to the whole answer: the model's load, its warm-up and the answer;
2. the same request again (loaded and warm);
3. ``--repeats`` streamed completions of ``--tokens`` tokens (ignore_eos):
   decode tokens/s between the first and the last token, and time to first
   token (a cold prefill of a ~60-token prompt: each run's differs from the
   first line on, so the prefix cache cannot serve it).

Rounds alternate the order of the variants so drift on a shared machine hits
both alike. Both demo registries are written (the float32 import done) before
anything is timed; the daemon converts the Q4_1 file into its cache as it
reads the registry, before it answers /health.

    python bench/demo_dtype.py                       # 2 rounds, 64 tokens, 3 repeats
    python bench/demo_dtype.py --rounds 3 --tokens 32

Prints a table and merges the figures into bench/results/demo_dtype.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, environment, reexec_with_openblas, save, serving, table  # noqa: E402
from bench.overhead import run_daemon  # noqa: E402

README_BODY = {"model": "default", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 20}
# The demo registry's dtype -> what its `default` entry is.
VARIANTS = {"q4_1": "bfloat16", "float32": "float32"}


def timed_chat(http: httpx.Client) -> tuple[float, str]:
    started = time.perf_counter()
    reply = http.post("/v1/chat/completions", json=README_BODY)
    reply.raise_for_status()
    return time.perf_counter() - started, reply.json()["choices"][0]["message"]["content"]


def one_daemon(registry: Path, tokens: int, repeats: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    # A fresh HOME: the demo registry's cache_dir is ~/.cache/mlxd, and a
    # prefix cache an earlier round saved there would flatter this one.
    with tempfile.TemporaryDirectory(prefix="mlxd-bench-") as tmp, \
            serving(registry, Path(tmp), env={"HOME": tmp}) as url, httpx.Client(base_url=url, timeout=900) as http:
        first_s, answer = timed_chat(http)
        status = next(m for m in http.get("/v1/status").json()["models"] if m["name"] == "smollm2-135m")
        second_s, again = timed_chat(http)
        # Each prompt its own first line: no run is served from the prefix
        # cache, so the time to first token is a cold prefill.
        runs = [run_daemon(http, tokens, model="default", prompt=f"# run {i}\n{PROMPT}") for i in range(repeats)]
        blas = http.get("/health").json().get("blas")
    rates = sorted(r["decode_tok_s"] for r in runs)
    return {
        "first_curl_s": round(first_s, 2),
        "load_s": status["last_load_seconds"],
        "warmup_s": status["warmup_seconds"],
        "second_curl_s": round(second_s, 2),
        "answer": answer,
        "same_answer_twice": answer == again,
        "decode_tok_s": round(statistics.median(rates), 2),
        "decode_runs": [round(r, 2) for r in rates],
        "ttft_s": round(statistics.median(r["ttft_s"] for r in runs), 3),
        "blas": blas,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reexec_with_openblas()

    from mlxd.cli.demo import write_demo

    with tempfile.TemporaryDirectory(prefix="mlxd-demo-dtype-") as tmp:
        registries = {}
        for variant, dtype in VARIANTS.items():
            registries[variant] = write_demo(Path(tmp) / variant, sizes=("tiny",), dtype=dtype)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                runs[variant].append(one_daemon(registries[variant], args.tokens, args.repeats))
                print(f"round {round_ + 1} {variant}: {json.dumps(runs[variant][-1])}", flush=True)

    def median(variant: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[variant]), 2)

    summary = {v: {k: median(v, k) for k in ("first_curl_s", "load_s", "warmup_s", "second_curl_s",
                                             "decode_tok_s", "ttft_s")} for v in VARIANTS}
    result = {"tokens": args.tokens, "repeats": args.repeats, "rounds": args.rounds, "summary": summary,
              "runs": runs, **environment()}
    print(f"\nSmolLM2-135M-Instruct through mlxd serve on the demo registry, median of {args.rounds} daemons "
          f"({args.repeats} x {args.tokens} tokens each); load average "
          f"{min(r['load_average'][0] for v in runs.values() for r in v)}-"
          f"{max(r['load_average'][1] for v in runs.values() for r in v)}")
    print(table(
        ["weights", "first curl s", "load s", "warm-up s", "second curl s", "decode tok/s", "TTFT s", "answer"],
        [[v, s["first_curl_s"], s["load_s"], s["warmup_s"], s["second_curl_s"], s["decode_tok_s"], s["ttft_s"],
          runs[v][0]["answer"]] for v, s in summary.items()],
    ))
    print(f"wrote {save('demo_dtype', 'smollm2', result)}")


if __name__ == "__main__":
    main()
