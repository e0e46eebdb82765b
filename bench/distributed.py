"""A parallel model's per-token cost: mlxd's gang (`parallel:`, streamed
through `mlxd serve`) against mlx-lm's own distributed generate
(`sharded_load` + `stream_generate` on every rank, the ranks started with
the variables `mlx.launch` sets), the same model, split and transport, in
one run.

    python bench/distributed.py --quick                 # offline, tiny model, seconds
    python bench/distributed.py --size bench --tokens 128 --repeats 3
    python bench/distributed.py --size bench --transport nccl   # one CUDA host, 2 GPUs

Each side runs its rounds after a warm-up round; medians are reported. The
gang then serves ``--streams`` requests at once (one continuous batch on its
ranks; mlx-lm's distributed generate has no batching) for its aggregate rate. The
same model in one process (one GPU) is run too, for what the split buys. Tokens/s is measured from the request to the last token (the same
prompt's prefill on both sides); CPU seconds per token are summed over every
process of each side (the ranks, and mlxd's daemon), which a loaded machine
disturbs far less than wall time. Target (issue #31): mlxd ÷ mlx-lm >= 0.95.
Prints a table and merges the figures into bench/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, add_dtype_option, daemon, environment, model_dtype, reexec_with_openblas, save, table  # noqa: E402

# One rank of mlx-lm's own distributed generate: what `mlx.launch -n N
# script.py` runs, here with the variables set by hand. Each rank prints each
# round's token times and CPU seconds as one JSON line.
PEER_RANK = r"""
import json, sys, time
import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import sharded_load
path, tokens, rounds, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
group = mx.distributed.init(strict=True, backend=sys.argv[5])
model, tokenizer = sharded_load(path, group if mode == "pipeline" else None, group if mode == "tensor" else None)
tokenizer._eos_token_ids = set()  # as mlx_lm.benchmark: decode to max_tokens
prompt = tokenizer.encode(sys.argv[6])
for _ in range(rounds):
    times, cpu = [time.perf_counter()], time.process_time()
    for r in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0)):
        times.append(time.perf_counter())
    print(json.dumps({"rank": group.rank(), "times": times, "cpu": time.process_time() - cpu}), flush=True)
"""


# The same model in one process (one GPU on a CUDA host): the gang's speed-up
# over it is what splitting bought.
SINGLE = r"""
import json, sys, time
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler
path, tokens, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model, tokenizer = load(path)
tokenizer._eos_token_ids = set()
prompt = tokenizer.encode(sys.argv[4])
for _ in range(rounds):
    times, cpu = [time.perf_counter()], time.process_time()
    for r in stream_generate(model, tokenizer, prompt, max_tokens=tokens, sampler=make_sampler(0.0)):
        times.append(time.perf_counter())
    print(json.dumps({"times": times, "cpu": time.process_time() - cpu}), flush=True)
"""


def run_single(path: Path, args: argparse.Namespace, rounds: int) -> list[tuple[float, float]]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    out = subprocess.run([sys.executable, "-c", SINGLE, str(path), str(args.tokens), str(rounds), PROMPT],
                         env=env, capture_output=True, text=True, timeout=1800, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [(rate(r["times"], args.tokens), r["cpu"] / args.tokens) for r in rows]


def rate(times: list[float], tokens: int) -> float:
    """Tokens per second from the request (``times[0]``) to the last token.
    Not first-to-last: the gang's tokens reach a client in bursts when the
    ranks' collectives spin on every core, which makes that interval tiny."""
    return tokens / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def run_peer(path: Path, args: argparse.Namespace, transport: str, rounds: int) -> list[tuple[float, float]]:
    """Per round: (tokens/s at rank 0, CPU seconds per token over every rank)."""
    from mlxd.distributed.gang import free_port, hostfile_text, rank_env

    with tempfile.TemporaryDirectory(prefix="mlxd-bench-peer-") as tmp:
        ports = [free_port() for _ in range(args.ranks)]
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(hostfile_text(ports))
        procs = []
        for rank in range(args.ranks):
            env = {**os.environ, **rank_env(transport, rank, args.ranks, ports, hostfile)}
            cmd = [sys.executable, "-c", PEER_RANK, str(path), str(args.tokens), str(rounds), args.mode, transport,
                   PROMPT]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    rows = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out in outs]
    return [(rate(rows[0][i]["times"], args.tokens), sum(r[i]["cpu"] for r in rows) / args.tokens)
            for i in range(rounds)]


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def run_gang(url: str, tokens: int, cpu: bool = True) -> tuple[float, float]:
    """(tokens/s seen by the client, CPU seconds per token over the daemon and every rank)."""
    pids: list[int] = []
    if cpu:
        status = httpx.get(f"{url}/v1/status", timeout=30).json()
        ranks = next((m.get("ranks") or [] for m in status["models"] if m["name"] == "gang"), [])
        pids = [status["daemon"]["pid"], *(r["pid"] for r in ranks)] if ranks else []
    before = cpu_of(pids) if pids else None
    times = [time.perf_counter()]
    body = {"model": "gang", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=1800) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text"):
                    times.append(time.perf_counter())
    per_token = (cpu_of(pids) - before) / tokens if before is not None else float("nan")
    return rate(times, tokens), per_token


def run_streams(url: str, tokens: int, streams: int) -> float:
    """Aggregate tokens/s of ``streams`` requests sent at once (the gang's
    continuous batch), from the first request to the last token."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(lambda _: run_gang(url, tokens, cpu=False), range(streams)))
    return streams * tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", help="factory size: tiny, small, bench (Qwen2.5-0.5B's shapes)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mode", default="tensor", choices=["tensor", "pipeline"])
    parser.add_argument("--transport", default="any", choices=["any", "ring", "nccl"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4,
                        help="concurrent streams for the batched case (the gang's max_concurrency); 0 skips it")
    parser.add_argument("--quick", action="store_true", help="tiny model, 32 tokens, 2 rounds: a smoke run")
    add_dtype_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.size, args.tokens, args.repeats = "tiny", 32, 2
    reexec_with_openblas()

    from mlxd.factory import ModelRecipe, build_model
    from mlxd.registry.device import current_device
    from mlxd.registry.parallel import default_transport

    transport = default_transport(current_device().kind) if args.transport == "any" else args.transport
    path = build_model(ModelRecipe("qwen2", args.size, dtype=model_dtype(args)))
    # The first round of each side is its warm-up (kernel compilation, and
    # for the gang its load).
    rounds = args.repeats + 1
    single = run_single(path, args, rounds)[1:]
    peer = run_peer(path, args, transport, rounds)[1:]
    gang: list[tuple[float, float]] = []
    parallel = {"mode": args.mode, "ranks": args.ranks, "transport": transport}
    batched: list[float] = []
    with daemon([{"name": "gang", "path": str(path), "parallel": parallel, "max_context": 4096,
                  "max_concurrency": max(1, args.streams)}]) as url:
        for _ in range(rounds):
            gang.append(run_gang(url, args.tokens))
        for _ in range(rounds if args.streams > 1 else 0):
            batched.append(run_streams(url, args.tokens, args.streams))
    gang, batched = gang[1:], batched[1:]
    single_rate, peer_rate, gang_rate = (statistics.median(r for r, _ in side) for side in (single, peer, gang))
    single_cpu, peer_cpu, gang_cpu = (statistics.median(c for _, c in side) for side in (single, peer, gang))
    print(table(
        ["path", "tok/s (median)", "ms/token wall", "CPU ms/token (all processes)", "rounds"],
        [["mlx-lm, one process", f"{single_rate:.1f}", f"{1000 / single_rate:.2f}", f"{1000 * single_cpu:.2f}",
          len(single)],
         ["mlx-lm distributed", f"{peer_rate:.1f}", f"{1000 / peer_rate:.2f}", f"{1000 * peer_cpu:.2f}", len(peer)],
         ["mlxd gang", f"{gang_rate:.1f}", f"{1000 / gang_rate:.2f}", f"{1000 * gang_cpu:.2f}", len(gang)]],
    ))
    ratio, cpu_ratio = gang_rate / peer_rate, peer_cpu / gang_cpu
    print(f"\nmlxd gang / mlx-lm: {ratio:.3f} by wall time, {cpu_ratio:.3f} by CPU per token (target >= 0.95); "
          f"{args.size}, {args.mode} over {args.ranks} ranks by {transport}, {args.tokens} tokens, "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"mlxd gang over {args.ranks} ranks / one process: {gang_rate / single_rate:.3f} by wall time")
    batched_rate = statistics.median(batched) if batched else None
    if batched_rate is not None:
        print(f"mlxd gang, {args.streams} concurrent streams (one continuous batch): {batched_rate:.1f} tok/s "
              f"in all, {batched_rate / gang_rate:.2f}x one stream")
    key = f"{args.size}-{args.mode}-{args.ranks}-{transport}"
    result = {"environment": environment(), "tokens": args.tokens,
              "peer_tok_s": [r for r, _ in peer], "gang_tok_s": [r for r, _ in gang],
              "peer_cpu_s_per_token": [c for _, c in peer], "gang_cpu_s_per_token": [c for _, c in gang],
              "single_tok_s": [r for r, _ in single], "single_cpu_s_per_token": [c for _, c in single],
              "single_median": single_rate, "peer_median": peer_rate, "gang_median": gang_rate, "ratio": ratio,
              "cpu_ratio": cpu_ratio, "gang_over_single": gang_rate / single_rate,
              "streams": args.streams, "batched_tok_s": batched, "batched_median": batched_rate}
    print(f"wrote {save('distributed', key, result)}")


if __name__ == "__main__":
    main()
