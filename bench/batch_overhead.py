"""What the daemon adds to a batched decode step: mlx-lm's BatchGenerator
driven in one process against the same model behind `mlxd serve`, at the
same numbers of rows.

    python bench/batch_overhead.py --size tiny --rows 1 4 8
    python bench/batch_overhead.py --size bench --rows 1 2 4 8 --profile

Both decode the same greedy prompt for ``--tokens`` tokens per row (end
tokens ignored); tok/s are all rows' tokens after each row's first, over the
span from the first token to the last. On an H100 (SmolLM2 bf16) the daemon
matched BatchGenerator at one row but reached 0.53-0.60 of it at 4 and 8
(bench/speculative.py's plain rows against bench/speculative_steps.py), so
this bench puts the two side by side in one run.

``--profile`` samples the daemon with py-spy (on ``$PATH`` or beside the
Python) during its largest batch and prints, per thread, the share of
samples in which it held the GIL and its busiest functions: whether the
event loop's streaming and the worker's step wait on each other.

Prints a table and merges the figures into bench/results/batch_overhead.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    PROMPT, daemon, environment, reexec_with_openblas, save, switch_interval_env, table,
)
from bench.profiling import newest_daemon_pid, profile, python_thread_names, summarize, thread_cpu  # noqa: E402


def raw_tok_s(path: Path, rows: int, tokens: int) -> float:
    """BatchGenerator alone: ``rows`` copies of the prompt, greedy."""
    from mlx_lm.generate import BatchGenerator

    model, tokenizer = _loaded(path)
    ids = tokenizer.encode(PROMPT)
    generator = BatchGenerator(model, stop_tokens=set(), completion_batch_size=64, prefill_batch_size=64)
    generator.insert([ids] * rows, max_tokens=[tokens] * rows)
    made, first = 0, None
    try:
        while True:
            out = generator.next()
            responses = out[1] if isinstance(out, tuple) else out
            if not responses:
                if first is not None:
                    break
                continue
            if first is None:  # each row's first token: the prefill's, not a step's
                first = time.perf_counter()
                continue
            made += len(responses)
            if all(r.finish_reason for r in responses):
                break
    finally:
        generator.close()
    return made / (time.perf_counter() - first)


_MODELS: dict[Path, Any] = {}


def _loaded(path: Path) -> Any:
    if path not in _MODELS:
        from mlx_lm import load

        _MODELS[path] = load(str(path))
    return _MODELS[path]


def daemon_tok_s(url: str, rows: int, tokens: int, chat: bool = False) -> float:
    firsts: list[float] = []
    ends: list[float] = []
    counts: list[int] = []

    def one() -> None:
        body: dict[str, Any] = {"model": "m", "max_tokens": tokens, "temperature": 0, "stream": True,
                                "ignore_eos": True, "stream_options": {"include_usage": True}}
        if chat:
            body["messages"] = [{"role": "user", "content": PROMPT}]
        else:
            body["prompt"] = PROMPT
        first, made = None, 0
        route = "/v1/chat/completions" if chat else "/v1/completions"
        with httpx.stream("POST", f"{url}{route}", json=body, timeout=900) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: {") and '"usage"' in line and '"choices":[]' in line:
                    made = int(line.split('"completion_tokens":')[1].split(",")[0].split("}")[0])
                elif line.startswith("data: {") and first is None:
                    first = time.perf_counter()
        ends.append(time.perf_counter())
        firsts.append(first or ends[-1])
        counts.append(made)

    threads = [threading.Thread(target=one) for _ in range(rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(c - 1 for c in counts) / (max(ends) - min(firsts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["tiny", "small", "bench", "smollm2"], default="tiny",
                        help="a random qwen2 of the factory's sizes, or the trained SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--chat", action="store_true", help="stream through /v1/chat/completions (default: /v1/completions)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="the daemon's sys.setswitchinterval (s), through a sitecustomize: does the GIL hand-off cost")
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.engine.cuda_attention import prefer_mlx_attention_kernels
    from mlxd.factory import ModelRecipe, build_model

    prefer_mlx_attention_kernels()
    if args.size == "smollm2":
        from mlxd.dtypes import device_dtype
        from mlxd.factory.smollm2 import smollm2_gguf
        from mlxd.gguf.cache import converted_dir

        path = converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=device_dtype("auto"))
    else:
        path = build_model(ModelRecipe("qwen2", args.size))
    raw_tok_s(path, 1, 8)  # kernels compiled before timing
    raw = {n: max(raw_tok_s(path, n, args.tokens) for _ in range(args.repeats)) for n in args.rows}
    with switch_interval_env(args.switch_interval) as env, tempfile.TemporaryDirectory(prefix="batch-overhead-") as tmp:
        entry = {"name": "m", "path": str(path), "preload": True, "max_concurrency": max(args.rows),
                 "idle_unload_seconds": 0}
        served: dict[int, float] = {}
        cpu_per_token: dict[int, dict[str, float]] = {}
        report = ""
        with daemon([entry], env=env) as url:
            pid = newest_daemon_pid()
            for _ in range(2):
                daemon_tok_s(url, max(args.rows), 16, args.chat)
            names = python_thread_names(pid)
            for n in args.rows:
                before = thread_cpu(pid, names)
                served[n] = max(daemon_tok_s(url, n, args.tokens, args.chat) for _ in range(args.repeats))
                after = thread_cpu(pid, names)
                made = n * (args.tokens - 1) * args.repeats
                # The event loop's and the worker's CPU per token: what each
                # row adds to a step, on whichever machine.
                cpu_per_token[n] = {name: 1e6 * (after[name] - before.get(name, 0.0)) / made
                                    for name in after if after[name] - before.get(name, 0.0) > 0.005}
            if args.profile:
                out = Path(tmp) / "profile.txt"
                seconds = 6.0
                spy = profile(pid, seconds, out)
                if spy is not None:
                    deadline = time.monotonic() + seconds + 1
                    while time.monotonic() < deadline:
                        daemon_tok_s(url, max(args.rows), args.tokens, args.chat)
                    spy.wait()
                    report = summarize(out, seconds) if out.exists() else "py-spy wrote nothing"
    rows = [[n, f"{raw[n]:.1f}", f"{served[n]:.1f}", f"{served[n] / raw[n]:.2f}",
             f"{1000 * n / raw[n]:.2f}", f"{1000 * n / served[n]:.2f}"] for n in args.rows]
    print(f"{args.size if args.size == 'smollm2' else 'qwen2-' + args.size}, {'chat' if args.chat else 'completions'}, {args.tokens} tokens a row, greedy, best of {args.repeats}"
          + (f", daemon switch interval {args.switch_interval}s" if args.switch_interval is not None else ""))
    print(table(["rows", "BatchGenerator tok/s", "mlxd tok/s", "mlxd / direct", "direct ms/step", "mlxd ms/step"],
                rows))
    for n, threads in cpu_per_token.items():
        print(f"{n} rows, daemon CPU us per token by thread: "
              + ", ".join(f"{name} {us:.0f}" for name, us in sorted(threads.items(), key=lambda kv: -kv[1])))
    if report:
        print(report)
    key = (args.size if args.size == "smollm2" else f"qwen2-{args.size}") + ("-chat" if args.chat else "") + (f"-switch{args.switch_interval}" if args.switch_interval is not None else "")
    print(f"wrote {save('batch_overhead', key, {'rows': {n: {'direct_tok_s': raw[n], 'mlxd_tok_s': served[n], 'cpu_us_per_token': cpu_per_token[n]} for n in args.rows}, 'tokens': args.tokens, **environment()})}")


if __name__ == "__main__":
    main()
