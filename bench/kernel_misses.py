"""Which kernels the first requests after a load still compile: what the
warm-up missed. Through a real `mlxd serve` on a factory model, with an empty
kernel cache (MLX_PTX_CACHE_DIR on CUDA, TMPDIR for the CPU backend's).

After the model is `loaded` (warm-up done) the kernel cache is listed, then
traffic of the shapes users send goes through, one step at a time: short and
long chats, a prompt of several prefill chunks, concurrent requests (the
batched path), sampling filters, penalties,
logprobs, a grammar (json_object; forced tool calls take the same path). After each step the
files the step added to the kernel cache are named, with its time to first
token. A warm-up that covers real traffic leaves every column at 0.

The load itself is split: the engine's own `mlx_lm.load`, the warm-up, and
the rest (fingerprint, restore, the daemon's bookkeeping), against
`mlx_lm.load` in a fresh process with the same kernel cache.

    python bench/kernel_misses.py --size bench --prompt-tokens 2000   # GPU
    python bench/kernel_misses.py --size tiny --prompt-tokens 500     # here

Prints a table and merges the figures into bench/results/kernel_misses.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.cold_start import direct_load, imported_seconds  # noqa: E402
from bench.common import RESULTS_DIR, ROOT, add_dtype_option, daemon, environment, model_dtype, save, table  # noqa: E402
from bench.prefix_cache import QUESTION, messages, model_status  # noqa: E402
from bench.restore_vs_recompute import corpus_ids, prompt_of  # noqa: E402


def kernel_files(root: Path) -> set[str]:
    """CUDA's under ptx/, the CPU backend's under mlx/<version>/cpu."""
    return {str(p.relative_to(root)) for sub in ("ptx", "mlx") for p in (root / sub).rglob("*") if p.is_file()}


def _has_output(event: dict[str, Any]) -> bool:
    return any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("tool_calls")
               for c in event.get("choices") or [])


def chat(http: httpx.Client, msgs: list[dict[str, str]], max_tokens: int, **sampling: Any) -> float:
    """Seconds to the first streamed chunk of a completion."""
    body = {"model": "m", "messages": msgs, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            **sampling}
    started = time.perf_counter()
    first = None
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and _has_output(json.loads(line[6:])):
                first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="bench")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--import-wait", type=float, default=15.0)
    parser.add_argument("--show", type=int, default=12, help="kernel file names printed per step")
    parser.add_argument("--kernel-dir", type=Path, default=None,
                        help="kernel cache folder to use and keep (default: a new, empty one)")
    parser.add_argument("--label", default="fresh", help="key of this run in the JSON")
    add_dtype_option(parser)
    args = parser.parse_args()
    dtype = model_dtype(args)

    from mlxd.factory import SIZES, ModelRecipe, build_model

    path = build_model(ModelRecipe("qwen2", args.size, dtype=dtype))
    ids = corpus_ids(path)
    n = args.prompt_tokens
    prompts = iter(messages(prompt_of(path, ids, n, i * n), QUESTION) for i in range(64))
    short = iter(messages(prompt_of(path, ids, 40, 40 * i + 7), QUESTION) for i in range(64))
    long_tokens = min(4 * n, SIZES[args.size].max_position_embeddings - 256, len(ids) - 8 * n)
    long_prompt = messages(prompt_of(path, ids, long_tokens, len(ids) - long_tokens), QUESTION)
    entry = {"name": "m", "path": str(path), "max_context": SIZES[args.size].max_position_embeddings,
             "idle_unload_seconds": 0, "max_concurrency": 8}

    def at_once(http: httpx.Client, batch: list[list[dict[str, str]]]) -> float:
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            return max(pool.map(lambda m: chat(http, m, args.max_tokens), batch))

    steps: list[tuple[str, Any]] = [
        (f"chat {n} tokens", lambda h: chat(h, next(prompts), args.max_tokens)),
        (f"chat {n} tokens again", lambda h: chat(h, next(prompts), args.max_tokens)),
        ("short chat", lambda h: chat(h, next(short), args.max_tokens)),
        (f"chat {long_tokens} tokens", lambda h: chat(h, long_prompt, args.max_tokens)),
        (f"4 x {n} at once", lambda h: at_once(h, [next(prompts) for _ in range(4)])),
        ("8 short at once", lambda h: at_once(h, [next(short) for _ in range(8)])),
        ("temperature 0.7 top_p 0.9", lambda h: chat(h, next(short), args.max_tokens, temperature=0.7, top_p=0.9)),
        ("top_k 20 min_p 0.05", lambda h: chat(h, next(short), args.max_tokens, temperature=0.8, top_k=20,
                                                min_p=0.05)),
        ("penalties", lambda h: chat(h, next(short), args.max_tokens, repetition_penalty=1.1,
                                     frequency_penalty=0.5, presence_penalty=0.5)),
        ("logprobs", lambda h: chat(h, next(short), args.max_tokens, logprobs=True, top_logprobs=3)),
        ("json_object", lambda h: chat(h, next(short), args.max_tokens, response_format={"type": "json_object"})),
        ("64 tokens decode", lambda h: chat(h, next(short), 64)),
    ]

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mlxd-kernels-") as tmp:
        root = args.kernel_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        initial = len(kernel_files(root))
        # In the load, so that `loaded` means the whole plan ran (with an empty
        # kernel cache the daemon would warm in the background).
        env = {"MLX_PTX_CACHE_DIR": str(root / "ptx"), "TMPDIR": str(root), "MLXD_WARMUP": "load"}
        log = RESULTS_DIR / "kernel_misses_logs" / "daemon.log"
        with daemon([entry], env=env, log_to=log) as url:
            with httpx.Client(base_url=url, timeout=900) as http:
                time.sleep(args.import_wait)
                started = time.perf_counter()
                http.post("/v1/models/m/load", json={}).raise_for_status()
                load_wall = time.perf_counter() - started
                status = model_status(http, "m")
                seen = kernel_files(root)
                after_load = len(seen)
                for name, run in steps:
                    ttft = run(http)
                    now = kernel_files(root)
                    added = sorted(now - seen)
                    seen = now
                    rows.append({"step": name, "ttft_s": round(ttft, 3), "kernels_added": len(added),
                                 "names": added})
                doc = http.get("/v1/status").json()
        direct = direct_load(path, {**os.environ, **env})
    engine = status["engine"]
    warmup = (engine.get("warmup") or {}).get("seconds") or 0.0
    own = engine.get("load_seconds") or 0.0
    whole = status["last_load_seconds"] or 0.0
    load = {"load_wall_s": round(load_wall, 3), "last_load_seconds": whole, "mlx_lm_load_in_daemon_s": own,
            "warmup_s": warmup, "rest_s": round(whole - own - warmup, 3),
            "kernels_at_start": initial, "kernels_after_load": after_load, "imported_mlx_lm_s": imported_seconds(log.read_text()),
            "direct": direct,
            "ratio_without_warmup": round((whole - warmup) / direct["first_load_s"], 2)
            if direct["first_load_s"] else None}
    first, again = rows[0]["ttft_s"], rows[1]["ttft_s"]
    result = {"size": args.size, "dtype": dtype, "prompt_tokens": n, "load": load, "steps": rows,
              "ttft_first_over_second": round(first / again, 2) if again else None,
              "status_device": doc["daemon"].get("device"), "budget_bytes": doc["memory"]["budget_bytes"],
              **environment()}
    print(f"\nqwen2-{args.size} {dtype} on {result['device']['kind']} ({result['device']['name']}), "
          f"{args.label}, {initial} kernel files at the start")
    print(f"load {whole:.2f}s = mlx_lm.load {own:.2f}s + warm-up {warmup:.2f}s + rest {load['rest_s']:.2f}s; "
          f"{after_load} kernel files after it; plain mlx_lm.load in a fresh process {direct['first_load_s']}s "
          f"(second {direct['second_load_s']}s): load without warm-up / mlx_lm.load = "
          f"{load['ratio_without_warmup']}")
    print(table(["after load, step", "TTFT s", "kernels compiled"],
                [[r["step"], r["ttft_s"], r["kernels_added"]] for r in rows]))
    print(f"first {n}-token chat after the load / the next one: {result['ttft_first_over_second']} (target <= 1.5)")
    print(f"status: device {result['status_device']}, budget {result['budget_bytes'] / 2**30:.1f} GiB")
    for r in rows:
        for name in r["names"][: args.show]:
            print(f"  {r['step']}: {name}")
    print(f"wrote {save('kernel_misses', f'qwen2-{args.size}-{dtype}-{args.label}', result).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
