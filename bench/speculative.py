"""Speculative decoding on SmolLM2-135M-Instruct (the demo's GGUF model):
decode speed with and without it, alone and under continuous batching, next
to mlx_lm.server with its own --draft-model (and vllm-mlx when its venv exists).

    python bench/speculative.py --quick      # short: a 40-line file, few tokens (offline, minutes)
    python bench/speculative.py              # the issue's figures: a 200-line file, 1, 4 and 8 streams
    python bench/speculative.py --repeats 3  # each mlxd figure the median of 3 runs (all kept in the JSON)

Workloads (chat, greedy, streamed through /v1/chat/completions):
- code edit: the prompt holds a Python file and asks for it back whole with
  one change (what a coding agent's edit is); prompt lookup drafts from it;
- free chat: a question whose answer is not in the prompt.

mlxd runs one daemon with entries of the same folder: `plain` (no
speculation), `lookup` (prompt_lookup, K=4), `selfdraft` (SmolLM2 as its
own draft, K=4: a draft the target's size can never pay, so mlxd leaves it
off and this row is what that costs against plain) and
`selfdraft-forced` (the same with `auto_off: false`: every draft is right,
so it measures what the mechanism costs against what full acceptance can
give); `--k 4 8` adds `lookup-k8`
and `selfdraft-k8` beside them (the same methods drafting 8 tokens a step). Each configuration serves 1, 4
and 8 concurrent streams of the same request; decode tok/s excludes each
stream's first token; the aggregate is all streams' tokens over the span from
the first stream's first token to the last one's last. mlx_lm.server (which
turns batching off when it has a draft model) serves the single stream with
`--draft-model` the same folder. Before each measurement the prompt is
prefilled once into the prefix cache (mlxd's, and mlx_lm.server's own), so
concurrent streams start decoding together.

Prints a table and merges the figures into bench/results/speculative.json.
The machine's load (`uptime`) goes with them: on a shared CPU the ratios
within one run are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    add_dtype_option, daemon, environment, free_port, model_dtype, reexec_with_openblas, save, table, wait_warm,
)
from bench.profiling import NATIVE_RATE, sampled  # noqa: E402
from bench.servers import Run, parse_stream, process_server, stream  # noqa: E402

VLLM_MLX = [Path(os.environ.get("VLLM_MLX_VENV", Path.home() / ".cache" / "mlxd-bench" / "vllm-mlx")),
            Path("/tmp/vllm-mlx")]


def code_file(lines: int) -> str:
    """A plain Python module of about ``lines`` lines (deterministic)."""
    out = ['"""Inventory records: load, check and report."""', "", "import json", "from pathlib import Path", ""]
    i = 0
    while len(out) < lines:
        out += [
            f"def check_item_{i}(record):",
            f'    """Validate field {i} of one inventory record."""',
            f"    value = record.get('field_{i}')",
            "    if value is None:",
            f"        raise ValueError('field_{i} is missing')",
            f"    return int(value) * {i + 2}",
            "",
        ]
        i += 1
    return "\n".join(out[:lines]) + "\n"


def requests(lines: int) -> dict[str, list[dict[str, str]]]:
    source = code_file(lines)
    return {
        "code_edit": [{"role": "user", "content": (
            "Here is a Python file:\n\n```python\n" + source + "```\n\nReturn the whole file, unchanged except "
            "that `check_item_0` is renamed to `validate_item_0`. Answer with the code only.")}],
        "free_chat": [{"role": "user", "content": "Tell me about the history of the bicycle and why people ride them."}],
    }


def one(port: int, model: str, messages: list[dict[str, str]], tokens: int, temperature: float = 0.0,
        extra: dict[str, Any] | None = None) -> Run:
    """``extra``: more of the request body (``--budget``'s reasoning budget)."""
    # Sampled answers run to their length (ignore_eos): their lengths would differ otherwise.
    sampled = {"temperature": temperature, "ignore_eos": True} if temperature else {"temperature": 0}
    body = json.dumps({"model": model, "messages": messages, "max_tokens": tokens, **sampled, **(extra or {}),
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    started, times, chunks = stream(port, "/v1/chat/completions", body)
    run = parse_stream(started, times, chunks)
    run.first_token_s += started  # absolute, for the aggregate span
    run.cpu_s = times[-1]
    return run


def prime(port: int, model: str, messages: list[dict[str, str]]) -> None:
    """The prompt into the server's prefix cache (a two-token answer)."""
    try:
        one(port, model, messages, 2)
    except RuntimeError as exc:
        if "no text" not in str(exc):
            raise


def variant(messages: list[dict[str, str]], i: int) -> list[dict[str, str]]:
    """Stream ``i``'s request: the code edit renames another function (free
    chat is the same request). Streams of one request keep the same drafts
    and give back the same positions every step, which real streams do not."""
    return [{**m, "content": m["content"].replace("check_item_0", f"check_item_{i}")} for m in messages]


def streams(port: int, model: str, messages: list[dict[str, str]], tokens: int, n: int,
            temperature: float = 0.0, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    runs: list[Run | BaseException] = [RuntimeError("not run")] * n

    def go(i: int) -> None:
        try:
            runs[i] = one(port, model, variant(messages, i), tokens, temperature, extra)
        except BaseException as exc:  # noqa: BLE001 - reported below
            runs[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in runs if isinstance(r, BaseException)]
    if bad:
        raise RuntimeError(f"{model}: {bad[0]}")
    done = [r for r in runs if isinstance(r, Run)]
    span_start = min(r.first_token_s for r in done)
    span = max(r.cpu_s for r in done) - span_start
    return {
        "streams": n,
        "per_stream_tok_s": statistics.median(r.decode_tok_s for r in done),
        "aggregate_tok_s": sum(r.tokens - 1 for r in done) / span if span > 0 else float("nan"),
        "tokens": [r.tokens for r in done],
        # Each stream's first token and end after the earliest first token:
        # a stream that starts late or stalls shows here, not in the median.
        "first_token_at_s": [round(r.first_token_s - span_start, 3) for r in done],
        "ended_at_s": [round(r.cpu_s - span_start, 3) for r in done],
        "text": done[0].text,
    }


def governor_state(http: httpx.Client, name: str) -> dict[str, Any] | None:
    """The entry's speculative figures in /v1/status (None for a plain entry)."""
    return next((m.get("speculative") for m in http.get("/v1/status").json()["models"] if m["name"] == name), None)


def governor_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, int] | None:
    """What one run added to the entry's speculative counters: its verify
    steps (per row), the drafts they verified and kept. A run whose
    governor stayed off still pays for its probes, and these say how many."""
    if not before or not after:
        return None
    return {key: after[key] - before[key] for key in ("verify_steps", "drafted_tokens", "accepted_tokens")
            if isinstance(after.get(key), int) and isinstance(before.get(key), int)}


def describe_governor(state: dict[str, Any] | None, delta: dict[str, int] | None = None) -> str:
    if not state:
        return ""
    speedup, acceptance = state.get("speedup"), state.get("acceptance_rate")
    run = (f"; this run verified {delta.get('verify_steps', 0)} row-steps, kept {delta.get('accepted_tokens', 0)} of "
           f"{delta.get('drafted_tokens', 0)} drafts" if delta else "")
    return (f"; speculating {'on' if state.get('active') else 'off'} at the end, speed-up "
            f"{'-' if speedup is None else f'{speedup:.2f}'}, acceptance "
            f"{'-' if acceptance is None else f'{acceptance:.2f}'}{run}")


def entry_name(method: str, k: int, ks: list[int]) -> str:
    """``lookup`` / ``selfdraft`` for the first K, ``lookup-k8`` ... for the others."""
    return method if k == ks[0] else f"{method}-k{k}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median aggregate speed, with every run's figure beside it:
    one run alone can be an outlier (a shape's first compile, a busy moment)."""
    ordered = sorted(runs, key=lambda r: r["aggregate_tok_s"])
    return {**ordered[(len(ordered) - 1) // 2], "aggregate_runs": [r["aggregate_tok_s"] for r in runs]}


def paired_ratio(run: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    """The median over repeats of this configuration's speed over plain's in
    the same repeat: they ran back to back, so a host's drift (a GPU host's
    plain runs moved by 44 % within one step) weighs on both sides alike."""
    if not base or "aggregate_runs" not in run or "aggregate_runs" not in base:
        return None
    return statistics.median(a / b for a, b in zip(run["aggregate_runs"], base["aggregate_runs"]))


METHODS = ("plain", "lookup", "selfdraft", "selfdraft-forced")


def mlxd_runs(path: Path, work: dict[str, Any], tokens: int, counts: list[int],
              ks: list[int], repeats: int = 1, methods: tuple[str, ...] = METHODS,
              temperature: float = 0.0, profile_to: Path | None = None,
              extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """``profile_to``: py-spy samples the daemon (native frames) through
    every timed run into that file, and its summary is printed."""
    # Loaded by the warm-up request: preloading three models can outlast the start-up wait.
    # The prefix cache holds every stream's primed prompt: 8 code edits of the
    # 200-line file are about 1 GB in float32 (46 KB a token), and at 512 MB
    # half of them were evicted before their run, so 8 streams started in
    # waves 13-27 s apart (prefilling) on this project's CPU, not together.
    common = {"path": str(path), "preload": False, "max_context": 8192, "max_concurrency": max(counts),
              "idle_unload_seconds": 0, "prefix_cache": {"max_bytes": "2GB", "persist": False}}
    entries = [{"name": "plain", **common}, {"name": "smol-draft", **common}]
    for k in ks:
        entries += [
            {"name": entry_name("lookup", k, ks), **common, "speculative": {"method": "prompt_lookup", "tokens": k}},
            {"name": entry_name("selfdraft", k, ks), **common,
             "speculative": {"method": "draft", "tokens": k, "draft_model": "smol-draft"}},
            {"name": entry_name("selfdraft-forced", k, ks), **common,
             "speculative": {"method": "draft", "tokens": k, "draft_model": "smol-draft", "auto_off": False}},
        ]
    names = tuple(e["name"] for e in entries
                  if e["name"] != "smol-draft" and e["name"].split("-k")[0] in methods)
    out: dict[str, Any] = {}
    with daemon(entries) as url, httpx.Client(base_url=url, timeout=1800) as http:
        port = int(url.rsplit(":", 1)[1])
        for name in names:
            one(port, name, [{"role": "user", "content": "Hi"}], 4)  # loads it
        wait_warm(http, names)
        with sampled(profile_to) as profiled:
            for workload, messages in work.items():
                for n in counts:
                    done: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
                    # Interleaved per stream count and repeat, so drift hits every configuration alike.
                    for repeat in range(repeats):
                        for name in names:
                            # Each stream's prompt prefilled once into the prefix cache: the streams
                            # then start decoding together, and decode is what is compared.
                            for i in range(n):
                                prime(port, name, variant(messages, i))
                            before = governor_state(http, name)
                            run = streams(port, name, messages, tokens, n, temperature, extra)
                            # Where the auto-off stood when the run ended: a first run that
                            # speculated less than the next shows here as off, or a speed-up below 1.
                            run["governor"] = governor_state(http, name)
                            run["governor_run"] = governor_delta(before, run["governor"])
                            done[name].append(run)
                            print(f"  {workload:9} {n} streams {name:9} run {repeat + 1}: "
                                  f"{run['aggregate_tok_s']:.2f} tok/s; first tokens at "
                                  f"{run['first_token_at_s']} s, ends at {run['ended_at_s']} s"
                                  f"{describe_governor(run['governor'], run['governor_run'])}", flush=True)
                    for name in names:
                        out[f"{workload}/{n}/{name}"] = median_run(done[name])
        if profile_to is not None:
            print(f"the daemon through the runs, sampled by py-spy (native frames, {NATIVE_RATE} Hz):")
            print("\n".join(f"  {line}" for line in profiled.report.splitlines()), flush=True)
        status = {m["name"]: m.get("speculative") for m in http.get("/v1/status").json()["models"]}
    return out, status


def peer_runs(path: Path, work: dict[str, Any], tokens: int, k: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spec-bench-") as tmp:
        port = free_port()
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(path), "--draft-model", str(path),
                "--num-draft-tokens", str(k), "--port", str(port)]
        with process_server("mlx_lm.server", argv, port, str(path), Path(tmp)) as server:
            one(server.port, server.model, [{"role": "user", "content": "Hi"}], 4)
            for workload, messages in work.items():
                prime(server.port, server.model, messages)
                out[f"{workload}/1/mlx_lm.server+draft"] = streams(server.port, server.model, messages, tokens, 1)
        venv = next((v for v in VLLM_MLX if (v / "bin" / "vllm-mlx").exists()), None)
        if venv is not None:
            port = free_port()
            argv = [str(venv / "bin" / "vllm-mlx"), "serve", str(path), "--port", str(port)]
            try:
                with process_server("vllm-mlx", argv, port, str(path), Path(tmp)) as server:
                    one(server.port, server.model, [{"role": "user", "content": "Hi"}], 4)
                    for workload, messages in work.items():
                        prime(server.port, server.model, messages)
                        out[f"{workload}/1/vllm-mlx"] = streams(server.port, server.model, messages, tokens, 1)
            except RuntimeError as exc:
                print(f"vllm-mlx left out: {exc}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 40-line file, 24 tokens, 1 and 4 streams")
    parser.add_argument("--lines", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--streams", type=int, nargs="*", default=None)
    parser.add_argument("--k", type=int, nargs="+", default=[4],
                        help="drafted tokens a step; more than one adds entries per K (the first is the peers')")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each mlxd configuration; the table shows the median run (the slower middle one of an even count)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="mlxd configurations to run (a subset also leaves the peers out)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample every request at this temperature (end tokens ignored; default greedy)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the daemon with py-spy (native frames) through the runs; the raw "
                             "samples go to bench/results/speculative-profile.txt")
    parser.add_argument("--workloads", nargs="+", choices=["code_edit", "free_chat"], default=None)
    parser.add_argument("--q4", action="store_true", help="keep the GGUF's 4-bit weights (slow on a CPU)")
    parser.add_argument("--budget", type=int, default=None,
                        help="every request carries a reasoning budget of this many tokens (reasoning.max_tokens), "
                             "as agents' requests to a thinking model do (with --model of a thinking family)")
    parser.add_argument("--model", type=Path, default=None,
                        help="another mlx-lm folder in SmolLM2's place, e.g. a tiny factory model: its steps "
                             "are short, so on a CPU the host's work per step weighs as on a fast GPU")
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    from mlxd.factory.smollm2 import smollm2_gguf
    from mlxd.gguf.cache import converted_dir

    # On a CPU the 4-bit kernels prefill at ~3 tok/s: the demo's own import
    # (float32 there, bfloat16 on a GPU) is what a user serves.
    dtype = "keep" if args.q4 else model_dtype(args)
    path = args.model or converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=dtype)
    lines = args.lines or (40 if args.quick else 200)
    tokens = args.tokens or (24 if args.quick else 160)
    counts = args.streams or ([1, 4] if args.quick else [1, 4, 8])
    work = {w: m for w, m in requests(lines).items() if args.workloads is None or w in args.workloads}
    methods = tuple(args.methods)
    subset = methods != METHODS or args.workloads is not None or args.temperature > 0
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    model = args.model.name if args.model else f"SmolLM2-135M-Instruct ({'Q4_1' if args.q4 else dtype})"
    print(f"{model}, {lines}-line file, {tokens} tokens, K={'/'.join(map(str, args.k))}; load: {load}", flush=True)
    profile_to = Path("bench/results/speculative-profile.txt") if args.profile else None
    if profile_to is not None:
        profile_to.parent.mkdir(parents=True, exist_ok=True)
    extra = {"reasoning": {"max_tokens": args.budget}} if args.budget is not None else None
    runs, status = mlxd_runs(path, work, tokens, counts, args.k, max(1, args.repeats), methods, args.temperature,
                             profile_to, extra)
    if not args.no_peers and not subset:
        runs.update(peer_runs(path, work, tokens, args.k[0]))
    rows = []
    for key, r in runs.items():
        workload, n, name = key.split("/")
        base = runs.get(f"{workload}/{n}/plain")
        ratio = r["aggregate_tok_s"] / base["aggregate_tok_s"] if base else float("nan")
        same = "yes" if base and r["text"] == base["text"] else ("-" if not base else "no")
        paired = paired_ratio(r, base)
        r["paired_ratio"] = paired
        rows.append([workload, n, name, f"{r['per_stream_tok_s']:.2f}", f"{r['aggregate_tok_s']:.2f}",
                     f"{ratio:.2f}x", "-" if paired is None else f"{paired:.2f}x", same])
    print(table(["workload", "streams", "server", "decode tok/s/stream", "aggregate tok/s", "vs plain",
                 "vs plain, by repeat", "same text"], rows))
    print("mlxd status:", json.dumps(status, indent=None))
    result = {"environment": environment(), "uptime": load, "dtype": "q4_1" if args.q4 else dtype, "lines": lines, "tokens": tokens, "k": args.k,
              "repeats": max(1, args.repeats),
              "runs": {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in runs.items()},
              "speculative_status": status}
    key = ("quick" if args.quick else f"{lines}-lines-{tokens}-tokens") + ("" if args.k == [4] else f"-k{'-'.join(map(str, args.k))}")
    if args.model:
        key += "-" + args.model.name
    if args.budget is not None:
        key += f"-budget{args.budget}"
    if subset:  # a partial run does not replace the full one's figures
        key += "-" + "-".join(methods + tuple(work)) + (f"-t{args.temperature}" if args.temperature else "")
    print(f"wrote {save('speculative', key, result)}")


if __name__ == "__main__":
    main()
