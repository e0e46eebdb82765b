"""A chat stream while 8 clients embed (issue #26): does the chat model keep
its pace, and does anything get evicted?

One daemon serves a pinned chat model and MiniLM. The chat client streams a
completion alone (solo), then again while 8 clients, each a process of its
own as an app is, send one text per request to ``/v1/embeddings`` in a loop
(beside). Per case, the median over ``--rounds`` of the stream's decode
tokens/s and of its longest gap between two pieces of text. Targets: both
within 10 % of solo (tokens/s at least 0.9x, longest gap at most 1.1x), and
no model unloaded or evicted.

    python bench/chat_beside_embeddings.py                    # SmolLM2 + MiniLM
    python bench/chat_beside_embeddings.py --chat tiny --tokens 64

The embedding passes and the chat's decode steps take turns on the one MLX
worker, so each gap of the chat beside them holds at most one embedding
batch; the figures say what that costs on the machine at hand. Prints a
table and merges the figures into bench/results/chat_beside_embeddings.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.profiling import newest_daemon_pid, python_thread_names, sampled, thread_cpu  # noqa: E402
from bench.common import (  # noqa: E402
    add_dtype_option, daemon, environment, gather_reports, model_dtype, reexec_with_openblas, save, switch_interval_env,
    table, wait_warm,
)

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TEXTS = [f"note {i}: the {w} sat near the {v} while the daemon served requests"
         for i, (w, v) in enumerate(zip(["cat", "dog", "bird", "fox"] * 8, ["mat", "door", "tree", "river"] * 8))]


def chat_model(name: str, dtype: str) -> Path:
    if name == "smollm2":
        from mlxd.factory.smollm2 import smollm2_gguf
        from mlxd.gguf.cache import converted_dir

        return converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype=dtype)
    from mlxd.factory import ModelRecipe, build_model

    # The factory's sizes in the dtype asked for too: a "large" one in float32 would be 30 GB.
    return build_model(ModelRecipe("qwen2", name, dtype=dtype))


def stream_chat(url: str, tokens: int) -> dict[str, float]:
    """One streamed completion: its decode tokens/s (first piece to last) and
    its longest gap between two pieces of text."""
    body = {"model": "chat", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    arrivals: list[float] = []
    made = 0
    with httpx.Client(timeout=600) as client, client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                made = event["usage"]["completion_tokens"]
            if any(choice.get("text") for choice in event.get("choices") or []):
                arrivals.append(time.perf_counter())
    if made != tokens or len(arrivals) < 2:
        raise RuntimeError(f"the chat stream made {made} tokens in {len(arrivals)} pieces, not {tokens}")
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"tok_s": (made - 1) / (arrivals[-1] - arrivals[0]), "longest_gap_s": max(gaps),
            "p99_gap_s": sorted(gaps)[min(len(gaps) - 1, round(0.99 * (len(gaps) - 1)))]}


def _embedder(url: str, index: int, ready: Any, stop: Any, done: Any) -> None:
    """One embedding client (a process of its own): one text a request until ``stop``."""
    served = 0
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            while not stop.is_set():
                text = TEXTS[(index + served) % len(TEXTS)]
                answer = client.post("/v1/embeddings", json={"model": "minilm", "input": text,
                                                             "encoding_format": "base64"})
                if answer.is_error:  # what the daemon said, not only its status
                    raise RuntimeError(f"{answer.status_code} after {served} requests: {answer.text[:300]}")
                served += 1
                if served == 1:
                    ready.put(None)
        done.put(served)
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        ready.put(None)
        done.put(repr(exc))


def rounds(url: str, tokens: int, n: int) -> list[dict[str, float]]:
    return [stream_chat(url, tokens) for _ in range(n)]


class ThreadShares:
    """The daemon's named threads' CPU time over a stretch, as a share of
    its wall time. On a CUDA machine the MLX worker spins while it waits for
    the device, so its share stays near 1 while it steps; what it loses
    beside the clients is time off the CPU: waiting for the GIL, which the
    event loop holds while it serves them (Linux)."""

    def __init__(self, url: str) -> None:
        self.pid = newest_daemon_pid(url)
        self.names = python_thread_names(self.pid)

    @contextlib.contextmanager
    def over(self, into: dict[str, float]) -> Iterator[None]:
        before, started = thread_cpu(self.pid, self.names), time.perf_counter()
        yield
        after, wall = thread_cpu(self.pid, self.names), time.perf_counter() - started
        # The event loop, the MLX worker and an encoder's pass thread (on CUDA).
        into.update({name: round((after[name] - before.get(name, 0.0)) / wall, 3)
                     for name in after if name == "MainThread" or name.startswith("mlx-")})


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def model_states(http: httpx.Client) -> dict[str, str]:
    return {m["name"]: m["state"] for m in http.get("/v1/status").json()["models"]}


def encoder_pace(http: httpx.Client) -> dict[str, Any]:
    """Where the encoder's passes stood against the chat's pace at the end
    (engine/generation_pace.py), and how long they waited for it; none from
    a daemon before it."""
    engine = next((m.get("engine") or {} for m in http.get("/v1/status").json()["models"] if m["name"] == "minilm"), {})
    return {"pace": engine.get("pace"), "paced_seconds": engine.get("paced_seconds")}


def unloads(http: httpx.Client) -> float:
    """Unloads so far, evictions included (``mlxd_model_unloads`` in /metrics)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in http.get("/metrics").text.splitlines()
               if line.startswith("mlxd_model_unloads_total"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chat", choices=["smollm2", "tiny", "small", "bench", "large"], default="smollm2",
                        help="the chat model: SmolLM2-135M-Instruct, or a random qwen2 of the factory's sizes "
                             "(large: Qwen2.5-7B's shapes, for a GPU)")
    parser.add_argument("--embedder", choices=["minilm", "tiny"], default="minilm",
                        help="the embedding model: MiniLM, or the factory's tiny random encoder, whose pass is short "
                             "on a CPU too, so that the clients' cost is the daemon's request path as on a GPU")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--profile", action="store_true",
                        help="py-spy samples the daemon (Python frames) while the clients embed: which thread holds the GIL for what")
    parser.add_argument("--repeats", type=int, default=1, help="daemons per tree, in turn")
    parser.add_argument("--baseline", type=Path,
                        help="also run the daemon of this checkout (`git archive REV | tar -x -C DIR`), in turn")
    parser.add_argument("--switch-intervals", type=float, nargs="+", metavar="S",
                        help="also run this tree's daemon with each of these GIL switch intervals (s), in turn: "
                             "does the worker wait for the GIL while the event loop serves the clients")
    add_dtype_option(parser)
    args = parser.parse_args()
    reexec_with_openblas()
    from bench.embeddings import model_folder

    entries = [
        {"name": "chat", "path": str(chat_model(args.chat, model_dtype(args))), "pinned": True, "preload": True,
         "max_context": 2048},
        {"name": "minilm", "path": str(model_folder(args.embedder)), "kind": "embedding", "preload": True},
    ]
    trees: list[tuple[str, Path | None, float | None]] = [("mlxd", None, None)]
    trees += [(f"mlxd, switch interval {1000 * s:g} ms", None, s) for s in args.switch_intervals or ()]
    trees += [("baseline", args.baseline.resolve(), None)] if args.baseline else []
    result: dict[str, Any] = {"chat": args.chat, "embedder": args.embedder, "tokens": args.tokens, "rounds": args.rounds,
                              "clients": args.clients, "environment": environment(), "trees": {}}
    rows = []
    for _ in range(args.repeats):
        for label, cwd, interval in trees:
            figures = measure(entries, args, cwd, interval)
            result["trees"].setdefault(label, []).append(figures)
            alone, shared = figures["solo_median"], figures["beside_median"]
            rows += [[label, name, f"{r['tok_s']:.1f}", f"{1000 * r['longest_gap_s']:.1f}", f"{1000 * r['p99_gap_s']:.1f}"]
                     for name, r in (("solo", alone), (f"beside {args.clients} embedding clients", shared))]
            if "profile" in figures:
                print(f"{label}: the daemon while the clients embed, sampled by py-spy:\n{figures['profile']}")
            shares = figures["thread_cpu_share"]
            if shares["beside"]:
                print(f"{label}: CPU time / wall time of the daemon's threads, solo -> beside: " + ", ".join(
                    f"{name} {shares['solo'].get(name, 0):.2f} -> {shares['beside'][name]:.2f}" for name in shares["beside"]))
            ratios, met = figures["ratios"], figures["met"]
            print(f"{label}: tok/s beside / solo {ratios['tok_s']:.2f} (target >= 0.9: {'met' if met['tok_s'] else 'not met'}); "
                  f"longest gap beside / solo {ratios['longest_gap']:.2f} (target <= 1.1: "
                  f"{'met' if met['longest_gap'] else 'not met'}); nothing unloaded: "
                  f"{'yes' if met['nothing_unloaded'] else 'no'}; embedding requests served meanwhile "
                  f"{figures['embedding_requests']}", flush=True)
            if figures["encoder_pace"]["pace"] is not None:
                print(f"{label}: the encoder's passes beside the chat at the end: {figures['encoder_pace']}", flush=True)
    print(table(["tree", "case", "chat tok/s", "longest gap ms", "p99 gap ms"], rows))
    print(f"\nchat {args.chat}, embedder {args.embedder}, {args.tokens} tokens, median of {args.rounds} streams a case")
    key = f"{args.chat}-{args.tokens}" + ("" if args.embedder == "minilm" else f"-{args.embedder}")
    print(f"-> {save('chat_beside_embeddings', key, result)}")


def measure(entries: list[dict[str, Any]], args: argparse.Namespace, cwd: Path | None,
            switch_interval: float | None) -> dict[str, Any]:
    """Solo and beside the embedding clients, on one daemon (of the checkout in
    ``cwd``, with that GIL switch interval)."""
    with switch_interval_env(switch_interval) as env, daemon(entries, env=env, cwd=cwd) as url, \
            httpx.Client(base_url=url, timeout=60) as http:
        wait_warm(http, ("chat",))
        rounds(url, args.tokens, 1)  # the first stream pays what a first one pays
        unloaded_before = unloads(http)
        shares = ThreadShares(url)
        cpu_solo: dict[str, float] = {}
        cpu_beside: dict[str, float] = {}
        with shares.over(cpu_solo):
            solo = rounds(url, args.tokens, args.rounds)
        spawn = multiprocessing.get_context("spawn")
        ready, stop, done = spawn.Queue(), spawn.Event(), spawn.Queue()
        clients = [spawn.Process(target=_embedder, args=(url, i, ready, stop, done)) for i in range(args.clients)]
        for c in clients:
            c.start()
        for _ in clients:
            ready.get(timeout=300)
        profile_to = Path("bench/results") / "chat_beside_embeddings-profile.txt" if args.profile else None
        with sampled(profile_to, native=False, rate=400) as sampling, shares.over(cpu_beside):
            beside = rounds(url, args.tokens, args.rounds)
        pace = encoder_pace(http)
        stop.set()
        reports = gather_reports(done, clients, "an embedding client")
        states = model_states(http)
        unloaded = unloads(http) - unloaded_before
    alone, shared = median_of(solo), median_of(beside)
    ratios = {"tok_s": shared["tok_s"] / alone["tok_s"], "longest_gap": shared["longest_gap_s"] / alone["longest_gap_s"]}
    return {"solo": solo, "beside": beside, "solo_median": alone, "beside_median": shared,
            "embedding_requests": sum(reports), "states": states, "encoder_pace": pace,
            "thread_cpu_share": {"solo": cpu_solo, "beside": cpu_beside},
            **({"profile": sampling.report} if args.profile else {}), "unloads": unloaded, "ratios": ratios,
            "met": {"tok_s": ratios["tok_s"] >= 0.9, "longest_gap": ratios["longest_gap"] <= 1.1,
                    "nothing_unloaded": unloaded == 0 and all(s == "loaded" for s in states.values())}}


if __name__ == "__main__":
    main()
