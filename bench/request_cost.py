"""Where an embedding request's time goes: a ladder of requests, each doing a
little more than the one before, through a running `mlxd serve`.

    python bench/request_cost.py                 # MiniLM
    python bench/request_cost.py --model tiny    # the factory's tiny encoder

Rungs (serial requests on one held client; median ms a request, best of
--rounds rounds of --requests each):
- ``GET /health``: HTTP, the middleware stack, a small answer;
- ``refused``: ``/v1/embeddings`` naming an unknown model, so the body is
  parsed and the entry looked up, and nothing more;
- ``1 text`` and ``32 texts``: answered requests.

For the answered rungs the daemon's own figures say where the rest went:
``in path`` is the daemon's ``mlxd_request_seconds`` (from the entry's
lookup to the accounts: lease, tokenizer, queue, the pass), ``pass`` the
forward passes on the MLX worker (``pass_seconds`` in the engine's status).
So client - in path is HTTP, the body and the answer's writing; in path -
pass is what mlxd's request path adds around the model. ``direct`` is the
same pass called in this process (mlx-embeddings' ``generate``), and
``cpu`` the daemon's CPU time a request (all its threads), which a loaded
machine does not move as it moves wall times.

Prints a table and merges the figures into bench/results/request_cost.json.
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

from bench.common import daemon, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.embeddings import corpus, model_folder  # noqa: E402

MODEL = "encoder"


def process_cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def request_seconds(client: httpx.Client) -> tuple[float, int]:
    """The daemon's ``mlxd_request_seconds`` sum and count for the model."""
    total, count = 0.0, 0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("mlxd_request_seconds_sum") and f'model="{MODEL}"' in line:
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("mlxd_request_seconds_count") and f'model="{MODEL}"' in line:
            count = int(float(line.rsplit(" ", 1)[1]))
    return total, count


def pass_seconds(client: httpx.Client) -> float:
    status = client.get("/v1/status").json()
    engine = next(m for m in status["models"] if m["name"] == MODEL)["engine"]
    return float(engine["pass_seconds"])


def ladder(url: str, texts: list[str], requests: int, rounds: int) -> dict[str, dict[str, float]]:
    rungs: dict[str, tuple[str, str, dict[str, Any] | None]] = {
        "GET /health": ("GET", "/health", None),
        "refused": ("POST", "/v1/embeddings", {"model": "no-such-model", "input": texts[0]}),
        "1 text": ("POST", "/v1/embeddings", {"model": MODEL, "input": texts[0], "encoding_format": "base64"}),
        "32 texts": ("POST", "/v1/embeddings", {"model": MODEL, "input": texts[:32], "encoding_format": "base64"}),
    }
    out: dict[str, dict[str, float]] = {}
    with httpx.Client(base_url=url, timeout=120) as client:
        pid = int(client.get("/v1/status").json()["daemon"]["pid"])
        for name, (method, path, body) in rungs.items():
            best: dict[str, float] | None = None
            for _ in range(rounds + 1):  # the first round warms
                in_path0, counted0 = request_seconds(client)
                pass0 = pass_seconds(client)
                cpu0 = process_cpu(pid)
                walls = []
                for _ in range(requests):
                    started = time.perf_counter()
                    client.request(method, path, json=body)
                    walls.append(time.perf_counter() - started)
                cpu = process_cpu(pid) - cpu0
                in_path, counted = request_seconds(client)
                figures = {"client_ms": statistics.median(walls) * 1000, "cpu_ms": cpu / requests * 1000}
                if counted > counted0 and name not in ("GET /health", "refused"):
                    figures["in_path_ms"] = (in_path - in_path0) / (counted - counted0) * 1000
                    figures["pass_ms"] = (pass_seconds(client) - pass0) / requests * 1000
                if best is None or figures["client_ms"] < best["client_ms"]:
                    best = figures
            out[name] = best or {}
    return out


def direct(folder: Path, texts: list[str], requests: int, rounds: int) -> dict[str, float]:
    import mlx.core as mx
    from mlx_embeddings import generate, load

    model, tokenizer = load(str(folder))
    out = {}
    for label, batch in (("1 text", texts[:1]), ("32 texts", texts[:32])):
        best = float("inf")
        for _ in range(rounds + 1):
            walls = []
            for _ in range(requests):
                started = time.perf_counter()
                mx.eval(generate(model, tokenizer, texts=batch, max_length=256).text_embeds)
                walls.append(time.perf_counter() - started)
            best = min(best, statistics.median(walls))
        out[label] = best * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    reexec_with_openblas()
    folder = model_folder(args.model)
    texts = corpus(64)
    direct_ms = direct(folder, texts, args.requests, args.rounds)
    with daemon([{"name": MODEL, "path": str(folder), "kind": "embedding", "preload": True}]) as url:
        rungs = ladder(url, texts, args.requests, args.rounds)
    rows = []
    for name, f in rungs.items():
        rows.append([name, f"{f['client_ms']:.2f}", f"{f['in_path_ms']:.2f}" if "in_path_ms" in f else "",
                     f"{f['pass_ms']:.2f}" if "pass_ms" in f else "",
                     f"{direct_ms[name]:.2f}" if name in direct_ms else "", f"{f['cpu_ms']:.2f}"])
    print(table(["rung", "client ms", "in path ms", "pass ms", "direct ms", "daemon cpu ms"], rows))
    result = {"model": args.model, "requests": args.requests, "rounds": args.rounds, "environment": environment(),
              "rungs": rungs, "direct_ms": direct_ms}
    print(f"wrote {save('request_cost', args.model, result)}")


if __name__ == "__main__":
    main()
