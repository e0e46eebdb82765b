"""What the first user of a daemon pays: the first load in a fresh process,
the first request after a load against the second, and a restart with the
kernel cache already warm. Through a real `mlxd serve`, on a factory model.

1. Fresh process, empty kernel cache (MLX_PTX_CACHE_DIR points at a new
   folder): load the model right after /health answers (the background
   `import mlx_lm` may still be running), then two different prompts of the
   same length. Targets (issue 16): first TTFT / second <= 1.5.
2. Restart with the kernel cache of 1, after the background import had time
   to finish: load, then the same two requests.
3. Plain mlx-lm in a fresh process: `import mlx_lm`, then `mlx_lm.load`
   twice. Target: the daemon's first load (without its warm-up) / the first
   `mlx_lm.load` <= 1.2.

    python bench/cold_start.py --size bench            # on a GPU: bf16
    python bench/cold_start.py --size tiny --prompt-tokens 500

Prints a table and merges the figures into bench/results/cold_start.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import RESULTS_DIR, ROOT, add_dtype_option, daemon, environment, model_dtype, save, table  # noqa: E402
from bench.prefix_cache import QUESTION, messages, model_status, stream_chat  # noqa: E402
from bench.restore_vs_recompute import corpus_ids, prompt_of  # noqa: E402

DIRECT = """
import json, sys, time
t = time.perf_counter(); import mlx_lm; imported = time.perf_counter() - t
t = time.perf_counter(); mlx_lm.load(sys.argv[1]); first = time.perf_counter() - t
t = time.perf_counter(); mlx_lm.load(sys.argv[1]); second = time.perf_counter() - t
print(json.dumps({"import_s": imported, "first_load_s": first, "second_load_s": second}))
"""


def direct_load(path: Path, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", DIRECT, str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return {k: round(v, 3) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def imported_seconds(log: str) -> float | None:
    found = re.search(r"imported mlx_lm in ([0-9.]+)s", log)
    return float(found.group(1)) if found else None


def session(url: str, prompts: list[list[dict[str, str]]], max_tokens: int, wait_s: float) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=900) as http:
        time.sleep(wait_s)
        started = time.perf_counter()
        http.post("/v1/models/m/load", json={}).raise_for_status()
        load_wall = time.perf_counter() - started
        status = model_status(http, "m")
        engine = status["engine"]
        replies = [stream_chat(http, "m", p, max_tokens) for p in prompts]
        doc = http.get("/v1/status").json()
    warmup = engine.get("warmup") or {}
    first, second = (r["ttft_s"] for r in replies)
    return {
        "load_wall_s": round(load_wall, 3),
        "last_load_seconds": status["last_load_seconds"],
        "engine_load_s": engine.get("load_seconds"),
        "warmup_s": warmup.get("seconds"),
        "prefill_tokens_per_s": warmup.get("prefill_tokens_per_s"),
        "ttft_first_s": round(first, 3),
        "ttft_second_s": round(second, 3),
        "ttft_ratio": round(first / second, 2) if second else None,
        "cached_tokens": [r["cached_tokens"] for r in replies],
        "device": doc["daemon"].get("device"),
        "budget_bytes": doc["memory"]["budget_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="bench")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--import-wait", type=float, default=15.0,
                        help="seconds the restarted daemon idles first, so its background import is done")
    add_dtype_option(parser)
    args = parser.parse_args()
    dtype = model_dtype(args)

    import os

    from mlxd.factory import ModelRecipe, SIZES, build_model

    path = build_model(ModelRecipe("qwen2", args.size, dtype=dtype))
    ids = corpus_ids(path)
    prompts = [messages(prompt_of(path, ids, args.prompt_tokens, i * args.prompt_tokens), QUESTION) for i in (0, 1)]
    entry = {"name": "m", "path": str(path), "max_context": SIZES[args.size].max_position_embeddings,
             "idle_unload_seconds": 0, "max_concurrency": 8}
    logs = RESULTS_DIR / "cold_start_logs"
    with tempfile.TemporaryDirectory(prefix="mlxd-ptx-") as ptx:
        env = {"MLX_PTX_CACHE_DIR": ptx}
        with daemon([entry], env=env, log_to=logs / "fresh.log") as url:
            fresh = session(url, prompts, args.max_tokens, 0.0)
        with daemon([entry], env=env, log_to=logs / "restart.log") as url:
            restart = session(url, prompts, args.max_tokens, args.import_wait)
        direct = direct_load(path, {**os.environ, **env})
    fresh["imported_mlx_lm_s"] = imported_seconds((logs / "fresh.log").read_text())
    restart["imported_mlx_lm_s"] = imported_seconds((logs / "restart.log").read_text())
    for run in (fresh, restart):
        own = (run["last_load_seconds"] or 0) - (run["warmup_s"] or 0)
        run["load_without_warmup_s"] = round(own, 3)
        run["load_ratio_to_mlx_lm"] = round(own / direct["first_load_s"], 2) if direct["first_load_s"] else None
    result = {"size": args.size, "dtype": dtype, "prompt_tokens": args.prompt_tokens, "fresh": fresh,
              "restart_warm_kernel_cache": restart, "mlx_lm_direct": direct, **environment()}
    print(f"\nqwen2-{args.size} {dtype} on {result['device']['kind']} ({result['device']['name']}), "
          f"{args.prompt_tokens}-token prompts")
    print(table(
        ["daemon", "load (wall) s", "of it warm-up s", "load / mlx_lm.load", "TTFT 1st s", "TTFT 2nd s",
         "1st / 2nd", "import mlx_lm s"],
        [[name, r["load_wall_s"], r["warmup_s"], r["load_ratio_to_mlx_lm"], r["ttft_first_s"], r["ttft_second_s"],
          r["ttft_ratio"], r["imported_mlx_lm_s"]] for name, r in (("fresh, empty kernel cache", fresh),
                                                                   ("restart, warm kernel cache", restart))]))
    print(f"plain mlx-lm: import {direct['import_s']}s, first load {direct['first_load_s']}s, "
          f"second {direct['second_load_s']}s; targets: TTFT 1st/2nd <= 1.5, load ratio <= 1.2")
    print(f"status: device {restart['device']}, budget {restart['budget_bytes'] / 2**30:.1f} GiB")
    print(f"wrote {save('cold_start', f'qwen2-{args.size}-{dtype}', result).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
