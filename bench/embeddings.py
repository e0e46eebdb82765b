"""Embedding throughput: all-MiniLM-L6-v2 through mlxd against mlx-embeddings
called directly in one process, in the same run.

Cases (texts/s and tokens/s, median of --rounds):
- batch 1: one text per call (direct) / per request, one client (mlxd);
- batch 32: 32 texts per call / per request;
- 8 clients: 8 concurrent clients each sending one text per request (mlxd
  batches their inputs into shared forward passes); against mlxd's batch 1
  figure, the same texts sent one at a time. The clients are 8 processes, as
  8 apps are; ``--client-threads`` adds the same as 8 threads of this one
  process (the figure until 2026-12-06), whose shared GIL bounds how fast
  they can ask.

Targets (issue 26): mlxd >= 0.9 of direct at batch 32; 8 clients >= 3x serial.
The same three cases against vllm-mlx's /v1/embeddings (``vllm-mlx serve
TEXT --embedding-model FOLDER``), in the same run, when
``bash bench/setup_vllm_mlx.sh`` has installed it.

    python bench/embeddings.py --texts 256 --rounds 3

``--model tiny`` runs the factory's tiny random encoder instead of MiniLM: on
a CPU MiniLM's pass takes most of a request, the tiny one's little, so what
mlxd adds around the pass shows there as it does on a GPU. ``--baseline DIR``
also runs the mlxd cases from another checkout (``git archive REV | tar -x
-C DIR``), in the same run: before and after under the same load.

Prints a table and merges the figures into bench/results/embeddings.json.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import tempfile
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import daemon, environment, free_port, gather_reports, reexec_with_openblas, save, table  # noqa: E402
from bench.servers import VLLM_MLX, process_server  # noqa: E402


def corpus(n: int) -> list[str]:
    """``n`` varied sentences (the reference texts' short ones, numbered so
    that none repeats)."""
    import runpy

    texts_file = Path(__file__).resolve().parent.parent / "tests" / "embeddings" / "reference" / "texts.py"
    short = [t for t in runpy.run_path(str(texts_file))["TEXTS"] if len(t) < 200]
    return [f"{short[i % len(short)]} ({i})" for i in range(n)]


def count_tokens(folder: Path, texts: list[str]) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # MiniLM's tokenizer.json pads to 128 unless told not to.
    tok.no_padding()
    tok.enable_truncation(256)
    return sum(len(e.ids) for e in tok.encode_batch(texts))


def median_rate(run: Callable[[], float], rounds: int) -> float:
    times = [run() for _ in range(rounds)]
    print(f"  rounds: {', '.join(f'{t:.2f}s' for t in times)}", flush=True)
    return statistics.median(times)


def direct(folder: Path, texts: list[str], batch: int, rounds: int) -> float:
    """mlx-embeddings' own ``generate`` in this process: seconds per pass over ``texts``."""
    import mlx.core as mx
    from mlx_embeddings import generate, load

    model, tokenizer = load(str(folder))

    def once() -> float:
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            mx.eval(generate(model, tokenizer, texts=texts[i:i + batch], max_length=256).text_embeds)
        return time.perf_counter() - started

    once()  # kernels compiled, caches warm
    return median_rate(once, rounds)


@contextlib.contextmanager
def vllm_mlx_embeddings(command: Path, folder: Path) -> Iterator[tuple[str, str]]:
    """``vllm-mlx serve`` with ``folder`` as its --embedding-model (it needs a
    text model beside it: the factory's tiny one, never asked). Yields its
    URL and the model name its /v1/embeddings takes (the folder, as given)."""
    from mlxd.factory import ModelRecipe, build_model

    text_model = build_model(ModelRecipe("qwen2", "tiny", dtype="float32"))
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="mlxd-bench-vllm-") as logs:
        with process_server("vllm-mlx", [str(command), "serve", str(text_model), "--port", str(port), "--offline",
                                         "--embedding-model", str(folder)], port, str(folder), Path(logs)):
            yield f"http://127.0.0.1:{port}", str(folder)


def model_folder(name: str) -> Path:
    if name == "tiny":
        from mlxd.factory.encoders import EncoderRecipe, build_encoder

        return build_encoder(EncoderRecipe("embedding"))
    from mlxd.factory.minilm import minilm_dir

    return minilm_dir()


def served(url: str, texts: list[str], batch: int, rounds: int, model: str = "minilm") -> float:
    with httpx.Client(base_url=url, timeout=300) as client:
        def once() -> float:
            started = time.perf_counter()
            for i in range(0, len(texts), batch):
                answer = client.post("/v1/embeddings", json={"model": model, "input": texts[i:i + batch],
                                                             "encoding_format": "base64"})
                answer.raise_for_status()
            return time.perf_counter() - started

        once()
        return median_rate(once, rounds)


def _client_process(url: str, model: str, share: list[str], ready: Any, go: Any, ends: Any) -> None:
    """One client of ``served_clients(..., processes=True)``: its connection
    opened and used once before the start, then its share sent one text a
    request; it reports when it finished (CLOCK_MONOTONIC is one clock for
    every process of the machine)."""
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            client.post("/v1/embeddings", json={"model": model, "input": "warm", "encoding_format": "base64"})
            ready.put(None)
            go.wait()
            for text in share:
                client.post("/v1/embeddings", json={"model": model, "input": text,
                                                    "encoding_format": "base64"}).raise_for_status()
        ends.put(time.monotonic())
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        ready.put(None)
        ends.put(repr(exc))


def served_clients(url: str, texts: list[str], clients: int, rounds: int, model: str = "minilm",
                   processes: bool = True) -> float:
    """``clients`` concurrent clients, each sending its share of ``texts``
    one per request: separate processes by default, as separate apps are
    (threads of one Python process share its GIL, which then bounds how
    fast the clients ask rather than how fast the server answers)."""
    shares = [texts[i::clients] for i in range(clients)]
    _clients_once(url, model, shares, processes)
    return median_rate(lambda: _clients_once(url, model, shares, processes), rounds)


def _clients_once(url: str, model: str, shares: list[list[str]], processes: bool) -> float:
    if processes:
        spawn = multiprocessing.get_context("spawn")
        ready, ends, go = spawn.Queue(), spawn.Queue(), spawn.Event()
        workers = [spawn.Process(target=_client_process, args=(url, model, s, ready, go, ends)) for s in shares]
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=120)
        started = time.monotonic()
        go.set()
        finished = gather_reports(ends, workers, "a client")
        return max(finished) - started

    failures: list[BaseException] = []

    def client_run(share: list[str]) -> None:
        try:
            with httpx.Client(base_url=url, timeout=300) as client:
                for text in share:
                    client.post("/v1/embeddings", json={"model": model, "input": text,
                                                        "encoding_format": "base64"}).raise_for_status()
        except BaseException as exc:  # noqa: BLE001 - reported after the join
            failures.append(exc)

    threads = [threading.Thread(target=client_run, args=(s,)) for s in shares]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - started


def batch_figures(url: str) -> dict[str, Any]:
    status = httpx.get(f"{url}/v1/status", timeout=10).json()
    model = next(m for m in status["models"] if m["name"] == "minilm")
    return {k: model.get("engine", {}).get(k) for k in ("requests", "inputs", "batches", "padded_tokens")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--client-threads", action="store_true",
                        help="also run the clients as threads of this process (the figure before 2026-12-06)")
    parser.add_argument("--model", choices=("minilm", "tiny"), default="minilm")
    parser.add_argument("--baseline", type=Path, help="also run mlxd from this checkout (before/after)")
    parser.add_argument("--vllm-mlx", type=Path, default=VLLM_MLX, help="the vllm-mlx command")
    args = parser.parse_args()
    reexec_with_openblas()
    folder = model_folder(args.model)
    texts = corpus(args.texts)
    tokens = count_tokens(folder, texts)
    seconds: dict[str, float] = {
        "direct batch 1": direct(folder, texts, 1, args.rounds),
        "direct batch 32": direct(folder, texts, 32, args.rounds),
    }
    checkouts = {"mlxd": None, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    figures: dict[str, Any] = {}
    for label, checkout in checkouts.items():
        with daemon([{"name": "minilm", "path": str(folder), "kind": "embedding", "preload": True}],
                    cwd=checkout) as url:
            seconds[f"{label} batch 1"] = served(url, texts, 1, args.rounds)
            seconds[f"{label} batch 32"] = served(url, texts, 32, args.rounds)
            seconds[f"{label} {args.clients} clients"] = served_clients(url, texts, args.clients, args.rounds)
            if args.client_threads:
                seconds[f"{label} {args.clients} client threads"] = served_clients(
                    url, texts, args.clients, args.rounds, processes=False)
            figures[label] = batch_figures(url)
    if args.vllm_mlx.exists():
        with vllm_mlx_embeddings(args.vllm_mlx, folder) as (url, name):
            seconds["vllm-mlx batch 1"] = served(url, texts, 1, args.rounds, name)
            seconds["vllm-mlx batch 32"] = served(url, texts, 32, args.rounds, name)
            seconds[f"vllm-mlx {args.clients} clients"] = served_clients(url, texts, args.clients, args.rounds, name)
    else:
        print(f"(no vllm-mlx at {args.vllm_mlx}: `bash bench/setup_vllm_mlx.sh` installs it; left out)")
    rows = []
    result: dict[str, Any] = {"model": args.model, "texts": len(texts), "tokens": tokens, "rounds": args.rounds,
                              "environment": environment(), "engine": figures["mlxd"], "cases": {}}
    for case, s in seconds.items():
        rows.append([case, f"{len(texts) / s:.1f}", f"{tokens / s:.0f}", f"{s:.2f}"])
        result["cases"][case] = {"seconds": s, "texts_per_s": len(texts) / s, "tokens_per_s": tokens / s}
    print(table(["case", "texts/s", "tokens/s", "seconds"], rows))
    for label in checkouts:
        ratio1 = seconds["direct batch 1"] / seconds[f"{label} batch 1"]
        ratio32 = seconds["direct batch 32"] / seconds[f"{label} batch 32"]
        speedup = seconds[f"{label} batch 1"] / seconds[f"{label} {args.clients} clients"]
        key = "" if label == "mlxd" else f"{label}_"
        result[f"{key}mlxd_over_direct_batch_1"] = ratio1
        result[f"{key}mlxd_over_direct_batch_32"] = ratio32
        result[f"{key}clients_over_serial"] = speedup
        threads = seconds.get(f"{label} {args.clients} client threads")
        if threads is not None:
            result[f"{key}client_threads_over_serial"] = seconds[f"{label} batch 1"] / threads
        print(f"\n{label}: / direct at batch 1: {ratio1:.2f}; at batch 32: {ratio32:.2f} (target >= 0.9); "
              f"{args.clients} clients / serial: {speedup:.2f}x (target >= 3x); engine: {figures[label]}")
    if "vllm-mlx batch 1" in seconds:
        peer = {case: seconds[f"vllm-mlx {case}"] / seconds[f"mlxd {case}"]
                for case in ("batch 1", "batch 32", f"{args.clients} clients")}
        result["mlxd_over_vllm_mlx"] = peer
        print("mlxd / vllm-mlx (texts/s): " + ", ".join(f"{case} {ratio:.2f}" for case, ratio in peer.items()))
    print(f"load average {result['environment']['load_average']}")
    print(f"-> {save('embeddings', args.model, result)}")


if __name__ == "__main__":
    main()
