"""Like with like: after a model reload, is restoring a saved prefix faster
than prefilling it again?

Both paths start from the same state, the model unloaded, and time the same
request (load, warm-up, then the first streamed text), through a real `mlxd
serve`:

- reload + recompute: a prompt the daemon has never seen, so after the load
  every token is prefilled;
- reload + restore: that same prompt again after an unload saved it, so the
  load restores it from disk (unless the restore decision, from this device's
  measured prefill and restore speeds, chose to recompute it) and only the
  last tokens are prefilled.

    python bench/restore_vs_recompute.py --size bench --prompt-tokens 2000 8000 32000
    python bench/restore_vs_recompute.py --size tiny --prompt-tokens 500 2000   # CPU smoke

Prints a table and merges the figures into bench/results/restore_vs_recompute.json.
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

from bench.common import ROOT, add_dtype_option, daemon, environment, model_dtype, save, table  # noqa: E402
from bench.prefix_cache import QUESTION, messages, model_status, stream_chat, wait_unloaded  # noqa: E402

CORPUS_MODULES = ("argparse", "logging", "pathlib", "typing", "inspect", "dataclasses", "subprocess",
                  "enum", "functools", "collections", "tarfile", "zipfile", "ast", "email.message")


def corpus_ids(path: Path) -> list[int]:
    import importlib

    from tokenizers import Tokenizer

    text = "".join(Path(importlib.import_module(m).__file__).read_text() for m in CORPUS_MODULES)
    return Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids


def prompt_of(path: Path, ids: list[int], tokens: int, skip: int) -> str:
    from tokenizers import Tokenizer

    if skip + tokens > len(ids):
        raise SystemExit(f"the corpus holds {len(ids)} tokens; {tokens} from {skip} do not fit")
    return Tokenizer.from_file(str(path / "tokenizer.json")).decode(ids[skip : skip + tokens])


def unload(http: httpx.Client) -> None:
    http.post("/v1/models/m/unload", json={}).raise_for_status()
    wait_unloaded(http, "m")


def timed_after_reload(http: httpx.Client, prompt: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    started = time.perf_counter()
    reply = stream_chat(http, "m", prompt, max_tokens)
    total = time.perf_counter() - started
    status = model_status(http, "m")
    engine = status["engine"]
    return {
        "total_s": round(total, 3),
        "load_s": status["last_load_seconds"],
        "warmup_s": (engine.get("warmup") or {}).get("seconds"),
        "prefill_tokens_per_s": (engine.get("warmup") or {}).get("prefill_tokens_per_s"),
        "restore_s": (engine.get("prefix_cache") or {}).get("last_restore_seconds"),
        "restored_entries": (engine.get("prefix_cache") or {}).get("restored_entries"),
        "cached_tokens": reply["cached_tokens"],
        "prompt_tokens": reply["prompt_tokens"],
        "text": reply["text"],
    }


def bench(size: str, dtype: str, sizes: list[int], max_tokens: int, repeats: int) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, SIZES, build_model

    path = build_model(ModelRecipe("qwen2", size, dtype=dtype))
    context = SIZES[size].max_position_embeddings
    too_long = [n for n in sizes if n + 256 > context]
    if too_long:
        raise SystemExit(f"{size} models take {context} tokens; {too_long} do not fit")
    ids = corpus_ids(path)
    entry = {"name": "m", "path": str(path), "max_context": context, "idle_unload_seconds": 0,
             "prefix_cache": {"max_bytes": "2GB", "disk_max_bytes": "8GB"}}
    rows: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    skip = 0
    with daemon([entry]) as url, httpx.Client(base_url=url, timeout=900) as http:
        http.post("/v1/models/m/load", json={}).raise_for_status()
        for _ in range(repeats):
            for n in sizes:
                prompt = messages(prompt_of(path, ids, n, skip), QUESTION)
                skip += n
                unload(http)
                recompute = timed_after_reload(http, prompt, max_tokens)
                unload(http)  # saves the prompt's KV to disk
                restore = timed_after_reload(http, prompt, max_tokens)
                rows[n].append({"recompute": recompute, "restore": restore})
                print(f"{n} tokens: reload+recompute {recompute['total_s']:.2f}s, reload+restore "
                      f"{restore['total_s']:.2f}s ({restore['cached_tokens']} cached)", flush=True)
                if skip + max(sizes) > len(ids):
                    skip = 0  # reuse the corpus from the start (the caches were unloaded)
    result: dict[str, Any] = {"size": size, "dtype": dtype, "repeats": repeats, "max_tokens": max_tokens, "by_tokens": {}}
    for n, runs in rows.items():
        def med(path_: str, key: str) -> float | None:
            values = [r[path_][key] for r in runs if r[path_][key] is not None]
            return round(statistics.median(values), 3) if values else None

        result["by_tokens"][str(n)] = {
            "recompute_total_s": med("recompute", "total_s"),
            "restore_total_s": med("restore", "total_s"),
            "load_s": {"recompute": med("recompute", "load_s"), "restore": med("restore", "load_s")},
            "restore_s": med("restore", "restore_s"),
            "cached_tokens": runs[0]["restore"]["cached_tokens"],
            "prompt_tokens": runs[0]["restore"]["prompt_tokens"],
            "prefill_tokens_per_s": med("recompute", "prefill_tokens_per_s"),
            "same_text": all(r["recompute"]["text"] == r["restore"]["text"] for r in runs),
            "runs": [{k: {f: v for f, v in r[k].items() if f != "text"} for k in r} for r in runs],
        }
    result.update(environment())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="small")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[2000])
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    add_dtype_option(parser)
    args = parser.parse_args()
    dtype = model_dtype(args)
    result = bench(args.size, dtype, args.prompt_tokens, args.max_tokens, args.repeats)
    rows = []
    for n, r in result["by_tokens"].items():
        ratio = r["restore_total_s"] / r["recompute_total_s"] if r["recompute_total_s"] else float("nan")
        rows.append([n, r["recompute_total_s"], r["restore_total_s"], f"{ratio:.2f}", r["cached_tokens"],
                     r["restore_s"], r["prefill_tokens_per_s"], r["same_text"]])
    print(f"\nqwen2-{args.size} {dtype}, {result['device']['kind']} ({result['device']['name']}), "
          f"median of {args.repeats}")
    print(table(["prompt tokens", "reload+recompute s", "reload+restore s", "restore/recompute", "cached",
                 "restore s", "prefill tok/s", "same text"], rows))
    path = save("restore_vs_recompute", f"qwen2-{args.size}-{dtype}", result)
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
