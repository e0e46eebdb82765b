"""Time to first token with the prefix cache: cold, warm in memory, and
restored from disk after an idle unload.

Runs a real `mlxd serve` process (which preloads OpenBLAS) on a factory model
in f32 with a ~2,000-token system prompt of real source text, streaming
greedy chat completions:

- cold: a system prompt the daemon has never seen (kernels already warm);
- warm, same prompt: the identical request again (everything but one token
  comes from the in-memory cache);
- warm, new question: the same system prompt with another user message (the
  agent / chat case: the system prompt comes from the cache);
- restored: the identical request after the model was unloaded for being
  idle (its cache saved) — the time includes loading the model again and
  restoring the cache from disk.

    python bench/prefix_cache.py --size small
    python bench/prefix_cache.py --size bench

Targets (issue: persisted prefix cache): restored <= 0.2x cold, warm <= 0.05x
cold. Prints a table and merges the figures into
bench/results/prefix_cache.json (one entry per size). Timing only: nothing
here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, ROOT, daemon, environment, save, table  # noqa: E402

QUESTION = "Which function parses the command line arguments, and what does it return?"
OTHER_QUESTION = "List the classes defined above and say what each one is for."
IDLE_SECONDS = 3


def source_text(path: Path, tokens: int, skip: int) -> str:
    """About ``tokens`` tokens of real Python source, starting ``skip`` tokens in."""
    import argparse as stdlib_argparse
    import logging
    import pathlib

    from tokenizers import Tokenizer

    text = "".join(Path(m.__file__).read_text() for m in (stdlib_argparse, logging, pathlib))
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    ids = tokenizer.encode(text).ids[skip : skip + tokens]
    return tokenizer.decode(ids)


def messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def stream_chat(http: httpx.Client, model: str, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One streamed greedy chat completion: time to first text, text, usage."""
    body = {
        "model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - started
                parts.append(text)
            usage = event.get("usage") or usage
    return {
        "ttft_s": first if first is not None else time.perf_counter() - started,
        "text": "".join(parts),
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }


def model_status(http: httpx.Client, name: str) -> dict[str, Any]:
    models = http.get("/v1/status").json()["models"]
    return next(m for m in models if m["name"] == name)


def wait_unloaded(http: httpx.Client, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while model_status(http, name)["state"] != "unloaded":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} was not unloaded within {timeout}s")
        time.sleep(0.1)


def run_round(http: httpx.Client, system: str, max_tokens: int) -> dict[str, Any]:
    prompt = messages(system, QUESTION)
    cold = stream_chat(http, "m", prompt, max_tokens)
    warm = stream_chat(http, "m", prompt, max_tokens)
    other = stream_chat(http, "m", messages(system, OTHER_QUESTION), max_tokens)
    wait_unloaded(http, "m")  # the idle unload saves the cache
    restored = stream_chat(http, "m", prompt, max_tokens)
    status = model_status(http, "m")
    return {
        "cold": cold, "warm": warm, "warm_new_question": other, "restored": restored,
        "load_seconds": status["last_load_seconds"],
        "prefix_cache": status["prefix_cache"],
        "restore_seconds": status["engine"].get("prefix_cache", {}).get("last_restore_seconds"),
    }


def bench(size: str, prompt_tokens: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, build_model

    path = build_model(ModelRecipe(arch="qwen2", size=size))
    model = {
        "name": "m", "path": str(path), "max_context": 4096,
        "idle_unload_seconds": IDLE_SECONDS, "prefix_cache": {"max_bytes": "512MB", "disk_max_bytes": "2GB"},
    }
    rounds = []
    with daemon([model]) as url, httpx.Client(base_url=url, timeout=600) as http:
        # Load and warm MLX's JIT-compiled kernels on a prompt sharing no prefix.
        http.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 2}).raise_for_status()
        daemon_blas = http.get("/v1/status").json()["daemon"]["blas"]["active"]
        for i in range(repeats):
            system = source_text(path, prompt_tokens, skip=i * prompt_tokens)
            rounds.append(run_round(http, system, max_tokens))
            print(f"round {i + 1}/{repeats}: " + ", ".join(
                f"{k} {rounds[-1][k]['ttft_s']:.2f}s" for k in ("cold", "warm", "warm_new_question", "restored")
            ), flush=True)

    def median(key: str, field: str = "ttft_s") -> float:
        return round(statistics.median(r[key][field] for r in rounds), 3)

    cold = median("cold")
    result = {
        "size": size,
        "repeats": repeats,
        "max_tokens": max_tokens,
        "prompt_tokens": rounds[0]["cold"]["prompt_tokens"],
        "ttft_s": {k: median(k) for k in ("cold", "warm", "warm_new_question", "restored")},
        "cached_tokens": {k: rounds[0][k]["cached_tokens"] for k in ("cold", "warm", "warm_new_question", "restored")},
        "ratio_to_cold": {k: round(median(k) / cold, 4) for k in ("warm", "warm_new_question", "restored")},
        "targets": {"warm": 0.05, "restored": 0.2},
        "restored_load_seconds": statistics.median(r["load_seconds"] for r in rounds),
        "restored_restore_seconds": statistics.median(r["restore_seconds"] or 0 for r in rounds),
        "last_save_seconds": rounds[-1]["prefix_cache"].get("last_save_seconds"),
        "disk_bytes": rounds[-1]["prefix_cache"].get("disk_bytes"),
        "same_text": all(len({r[k]["text"] for k in ("cold", "warm", "restored")}) == 1 for r in rounds),
        "ttft_runs": {k: [round(r[k]["ttft_s"], 3) for r in rounds]
                      for k in ("cold", "warm", "warm_new_question", "restored")},
        **environment(),
        # What the daemon's matmuls run on (this process does not compute).
        "blas": daemon_blas,
    }
    return result


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\nqwen2-{result['size']} f32: prompt {result['prompt_tokens']} tokens, median of "
        f"{result['repeats']}, daemon BLAS: {result['blas']}"
    )
    labels = {
        "cold": "cold prefill",
        "warm": "warm in memory (same prompt)",
        "warm_new_question": "warm in memory (new question)",
        "restored": "restored from disk after idle unload",
    }
    rows = []
    for key, label in labels.items():
        ratio = "1.000" if key == "cold" else f"{result['ratio_to_cold'][key]:.3f}"
        target = {"warm": "<= 0.05", "restored": "<= 0.20"}.get(key, "")
        rows.append([label, f"{result['ttft_s'][key]:.3f}", ratio, target, result["cached_tokens"][key]])
    print(table(["path", "TTFT s", "x cold", "target", "cached tokens"], rows))
    print(
        f"restored = model load {result['restored_load_seconds']:.2f}s (cache restore "
        f"{result['restored_restore_seconds']:.3f}s of it) + prefill of the rest; "
        f"save before unload {result['last_save_seconds']}s, {(result['disk_bytes'] or 0) >> 20} MB on disk; "
        f"same greedy text cold/warm/restored: {result['same_text']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="small")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or {"tiny": 3, "small": 3, "bench": 1}[args.size]
    result = bench(args.size, args.prompt_tokens, args.max_tokens, repeats)
    print_table(result)
    path = save("prefix_cache", f"qwen2-{args.size}", result)
    print(f"\nwrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
