"""Priority classes under load (issue #27, docs/apps.md): 4 bulk clients keep
one model busy with long generations while an interactive client sends short
requests, on the same daemon, once with every client in one class (no
priorities: the fair queue is first come, first served) and once with the
bulk clients' app `bulk` and the interactive client's app `interactive`.

Reported per run: the interactive client's time to first token (p50, p95) and
the bulk requests' completion times, against the interactive client's idle
TTFT and a bulk request's solo time, both measured first on the same daemon.
Targets: interactive p95 TTFT within 1.5x idle, every bulk request within 2x
its solo time. Each bulk client is a process of its own, as an app is (until
2026-12-06 they were threads of the bench, whose GIL the interactive client's
timing shared).

    python bench/app_priority.py --size tiny --seconds 20
    python bench/app_priority.py --size small --bulk-tokens 128 --seconds 30
    python bench/app_priority.py --size tiny --bulk-prompt-words 600   # a RAG indexer's long, distinct prompts

``--baseline DIR`` runs the daemon of another checkout too (``git archive
REV | tar -x -C DIR``), in turn with this one: before and after on one
machine, in one run.
``--repeats N`` runs every case on N daemons, in turn with the baseline's,
and adds a row per case with the N runs' samples pooled: on one H100 the
same daemon's interactive p95 read 1.55x and 2.57x its idle figure in two
runs, so one run of each does not tell a change of that size.

With ``--bulk-prompt-words N`` every bulk request sends a prompt of its own of
about N words (no prefix-cache hit), so its prefill takes many chunks, as an
indexer's documents do; the interactive client's prompt stays the short one.

Prints a table and merges the figures into bench/results/app_priority.json.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import keyword
import multiprocessing
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.common import PROMPT, environment, save, serving, table, wait_warm  # noqa: E402
from bench.profiling import NATIVE_RATE, sampled  # noqa: E402

KEYS = {"interactive": "sk-bench-interactive", "bulk": "sk-bench-bulk"}


def registry(tmp: Path, model: Path, concurrency: int, priorities: bool) -> Path:
    apps = [{"name": name, "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
             "priority": name if priorities else "default"} for name, key in KEYS.items()]
    doc = {
        "manager": {"memory_budget": "70%", "cache_dir": str(tmp / "cache")},
        "apps": apps,
        "models": [{"name": "m", "path": str(model), "preload": True, "max_concurrency": concurrency,
                    "max_context": 4096, "max_queue": 64}],
    }
    path = tmp / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def document(words: int, seed: int) -> str:
    """A prompt of about ``words`` words that no other request shares."""
    names = [w for w in keyword.kwlist if w.isalpha()]
    return f"# document {seed}\n" + " ".join(f"{names[(i * 7 + seed) % len(names)]}_{seed}_{i}" for i in range(words))


# One httpx client per client (thread or process), as an app holds one: a new client per
# request builds an SSL context each time (~30 ms), which would sit in every
# time to first token and flatter the ratios to the idle figure.
_CLIENTS = threading.local()


def _client() -> httpx.Client:
    if not hasattr(_CLIENTS, "client"):
        _CLIENTS.client = httpx.Client(timeout=900)
    return _CLIENTS.client


def stream(url: str, key: str, tokens: int, prompt: str = PROMPT) -> tuple[float, float]:
    """(time to first token, total seconds) of one streamed completion."""
    body = {"model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0.7, "stream": True,
            "ignore_eos": True}
    started = time.perf_counter()
    first = None
    with _client().stream("POST", f"{url}/v1/completions", json=body,
                          headers={"authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line and first is None:
                first = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, ended - started


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


_SEEDS = itertools.count()


def bulk_prompt(args: argparse.Namespace) -> str:
    return document(args.bulk_prompt_words, next(_SEEDS)) if args.bulk_prompt_words else PROMPT


def _bulk_process(url: str, tokens: int, words: int, seed_base: int, began: float, stop: Any, done: Any) -> None:
    """One bulk client, a process of its own as a separate app is: it asks
    for bulk completions until ``stop`` is set and reports each one's start
    (s after ``began``, CLOCK_MONOTONIC: one clock for the whole machine)
    and length. Threads in the bench's process would share its GIL with the
    interactive client, whose measured first tokens would then wait on the
    bulk clients' stream parsing instead of on the daemon."""
    seeds = itertools.count(seed_base)
    try:
        while not stop.is_set():
            started = time.monotonic() - began
            prompt = document(words, next(seeds)) if words else PROMPT
            done.put((started, stream(url, KEYS["bulk"], tokens, prompt)[1]))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        done.put(repr(exc))


def contended(url: str, args: argparse.Namespace, profile_to: Path | None = None) -> dict[str, Any]:
    """4 bulk clients in a loop, one interactive client of short requests, for
    ``args.seconds``; ``profile_to``: py-spy samples the daemon meanwhile,
    native frames included, into that file."""
    spawn = multiprocessing.get_context("spawn")
    stop, done = spawn.Event(), spawn.Queue()
    ttft: list[float] = []
    ttft_started: list[float] = []
    began = time.monotonic()
    clients = [spawn.Process(target=_bulk_process,
                             args=(url, args.bulk_tokens, args.bulk_prompt_words, 1_000_000 * (i + 1), began, stop, done))
               for i in range(args.bulk_clients)]
    for c in clients:
        c.start()
    time.sleep(2.0)  # let the bulk clients fill the model first
    with sampled(profile_to) as sampling:
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            ttft_started.append(time.monotonic() - began)
            ttft.append(stream(url, KEYS["interactive"], args.interactive_tokens)[0])
            time.sleep(args.think)
    stop.set()
    reports = []
    while any(c.is_alive() for c in clients) or not done.empty():
        try:
            reports.append(done.get(timeout=1))
        except queue.Empty:
            pass
    for c in clients:
        c.join()
    failed = [r for r in reports if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"a bulk client failed: {failed[0]}")
    # When each request began (s after the bulk clients started): whether the
    # slow ones cluster at the start (first uses of batch shapes) or not.
    return {"interactive_ttft": ttft, "interactive_started_s": ttft_started,
            "bulk_seconds": [s for _, s in reports], "bulk_started_s": [at for at, _ in reports],
            **({"profile": sampling.report} if profile_to is not None else {})}


def slow_turns(log: Path) -> dict[str, Any]:
    """The batch loop's slow turns (debug log, engine/turn_clock.py): how
    many, and the slowest few as logged."""
    logged = [line.split(": ", 2)[-1] for line in log.read_text(errors="replace").splitlines()]
    lines = [line for line in logged if line.startswith("slow turn")]
    slowest = sorted(lines, key=lambda line: -float(line.split()[2]))[:6]
    # The turns where several requests joined at once: the usual tail.
    joins = [float(line.split()[2]) for line in lines
             if (m := re.search(r"joined (\d+)", line)) and int(m.group(1)) >= 2]
    # The interactive requests' slow first texts (idle and loaded): where their time went.
    firsts = [line for line in logged if line.startswith("slow first text") and ", interactive:" in line]
    return {"count": len(lines), "slowest": slowest, "joins_of_2_or_more": len(joins),
            "join_turn_median_ms": statistics.median(joins) if joins else None,
            "slow_first_texts": len(firsts),
            "slowest_first_texts": sorted(firsts, key=lambda line: -float(line.split()[3]))[:6]}


def run(model: Path, args: argparse.Namespace, priorities: bool, cwd: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mlxd-bench-apps-") as tmp:
        path = registry(Path(tmp), model, args.concurrency, priorities)
        log = Path(tmp) / "daemon-copy.log"
        env = {"MLXD_LOG_LEVEL": "debug"} if args.turns else None
        with serving(path, Path(tmp), env=env, log_to=log if args.turns else None, cwd=cwd) as url:
            # A fresh GPU machine compiles the warm-up's kernels in the background, behind the
            # first requests: the figures are of a daemon that has been up a while.
            with httpx.Client(base_url=url, timeout=60, headers={"authorization": f"Bearer {KEYS['interactive']}"}) as http:
                wait_warm(http, ("m",))
            for _ in range(2):  # warm up
                stream(url, KEYS["interactive"], args.interactive_tokens)
            idle = [stream(url, KEYS["interactive"], args.interactive_tokens)[0] for _ in range(args.idle_samples)]
            solo = [stream(url, KEYS["bulk"], args.bulk_tokens, bulk_prompt(args))[1] for _ in range(2)]
            # The raw samples go with the results (bench/gpu_wave3.sh brings bench/results back).
            profile_to = (Path("bench/results") / f"app_priority-profile-{'priorities' if priorities else 'none'}.txt"
                          if args.profile else None)
            load = contended(url, args, profile_to)
        turns = {"slow_turns": slow_turns(log)} if args.turns and log.exists() else {}
    return {"idle_ttft": idle, "solo_bulk_seconds": solo, **load, **turns}


HEADERS = ["run", "idle p50 ms", "idle p95 ms", "TTFT p50 ms", "TTFT p95 ms", "p95 vs idle", "p95 vs idle p50", "n",
           "solo bulk s", "bulk p50 s", "bulk max s", "max vs solo", "n"]


def ratios(r: dict[str, Any]) -> dict[str, float]:
    """A run's figures against the targets: the interactive p95 over the
    idle p95 (within 1.5x) and the slowest bulk request over solo (within
    2x). The target's ratio is to the idle p95, which two slow samples of 30
    can set (32 ms where the other 28 were 11-16, on an H100): the ratio to
    the idle median says how far the loaded tail is from a typical idle
    request."""
    loaded = p95(r["interactive_ttft"])
    return {"interactive_p95_vs_idle": loaded / p95(r["idle_ttft"]),
            "interactive_p95_vs_idle_p50": loaded / statistics.median(r["idle_ttft"]),
            "bulk_max_vs_solo": max(r["bulk_seconds"]) / statistics.median(r["solo_bulk_seconds"])}


def summary(name: str, r: dict[str, Any]) -> list[Any]:
    ttft, bulk, of = r["interactive_ttft"], r["bulk_seconds"], ratios(r)
    return [
        name, f"{1000 * statistics.median(r['idle_ttft']):.0f}", f"{1000 * p95(r['idle_ttft']):.0f}",
        f"{1000 * statistics.median(ttft):.0f}", f"{1000 * p95(ttft):.0f}", f"{of['interactive_p95_vs_idle']:.2f}x",
        f"{of['interactive_p95_vs_idle_p50']:.2f}x", len(ttft), f"{statistics.median(r['solo_bulk_seconds']):.2f}",
        f"{statistics.median(bulk):.2f}", f"{max(bulk):.2f}", f"{of['bulk_max_vs_solo']:.2f}x", len(bulk),
    ]


POOLED = ("idle_ttft", "solo_bulk_seconds", "interactive_ttft", "interactive_started_s", "bulk_seconds",
          "bulk_started_s")


def pooled(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """The samples of several daemons' runs of one case taken together: the
    p95s and the slowest bulk request over all of them."""
    return {key: [x for r in repeats for x in r[key]] for key in POOLED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["tiny", "small", "bench"], default="tiny")
    parser.add_argument("--seconds", type=float, default=20.0, help="contended phase length per run")
    parser.add_argument("--bulk-clients", type=int, default=4)
    parser.add_argument("--bulk-tokens", type=int, default=256)
    parser.add_argument("--interactive-tokens", type=int, default=8)
    parser.add_argument("--bulk-prompt-words", type=int, default=0,
                        help="a distinct prompt of about this many words per bulk request (0: the shared short one)")
    parser.add_argument("--concurrency", type=int, default=4, help="the model's max_concurrency")
    parser.add_argument("--think", type=float, default=0.2, help="seconds between interactive requests")
    # The target is a ratio to the idle p95: of 10 samples that is their
    # largest but one, which moved between 11 and 31 ms from daemon to daemon
    # on one H100, and of 30 their second largest (two slow samples of 30 set
    # it at 32 ms against a median of 12). Of 120 it is the sixth largest:
    # 18-23 ms on one H100 in four daemons, for about 3 s more a daemon.
    parser.add_argument("--idle-samples", type=int, default=120)
    parser.add_argument("--baseline", type=Path,
                        help="also run the daemon of this checkout (`git archive REV | tar -x -C DIR`), in turn")
    parser.add_argument("--priorities-only", action="store_true", help="only the run with priorities")
    parser.add_argument("--repeats", type=int, default=1,
                        help="daemons per case, in turn with the baseline's; with more than one, each case's "
                             "samples are also pooled (its row ', pooled')")
    parser.add_argument("--profile", action="store_true",
                        help="sample the daemon with py-spy (native frames) while it is under load; "
                             "the busiest functions per thread are printed, the samples kept in bench/results")
    parser.add_argument("--turns", action="store_true",
                        help="run the daemon at debug level and print its batch loop's slowest turns and "
                             "interactive first texts (where a tail comes from)")
    args = parser.parse_args()

    from mlxd.factory import ModelRecipe, build_model

    model = build_model(ModelRecipe("qwen2", args.size))
    runs = {}
    modes = [("priorities", True)] if args.priorities_only else [("no priorities", False), ("priorities", True)]
    trees = [("", None)] + ([("baseline, ", args.baseline.resolve())] if args.baseline else [])
    # Before and after in turn, mode by mode: drift on the machine hits both alike.
    for repeat in range(args.repeats):
        for mode, priorities in modes:
            for label, cwd in trees:
                name = label + mode + (f" ({repeat + 1})" if args.repeats > 1 else "")
                runs[name] = run(model, args, priorities=priorities, cwd=cwd)
                print(table(HEADERS, [summary(name, runs[name])]), flush=True)
    if args.repeats > 1:
        # One H100 gave an unchanged daemon 1.55x and 2.57x in two runs: single runs do not settle small effects.
        for mode, _ in modes:
            for label, _ in trees:
                name = label + mode
                runs[f"{name}, pooled"] = pooled([runs[f"{name} ({k + 1})"] for k in range(args.repeats)])
    result = {
        "size": args.size, "bulk_clients": args.bulk_clients, "bulk_tokens": args.bulk_tokens,
        "interactive_tokens": args.interactive_tokens, "max_concurrency": args.concurrency,
        "bulk_prompt_words": args.bulk_prompt_words,
        "seconds": args.seconds, "runs": runs, **environment(),
    }
    prompts = f", {args.bulk_prompt_words}-word prompts" if args.bulk_prompt_words else ""
    print(f"\nqwen2-{args.size}, max_concurrency {args.concurrency}: {args.bulk_clients} bulk clients x "
          f"{args.bulk_tokens} tokens{prompts}, 1 interactive client x {args.interactive_tokens} tokens, "
          f"{args.seconds:.0f} s; load average {result['load_average']}")
    print(table(HEADERS, [summary(name, r) for name, r in runs.items()]))
    for name, r in runs.items():
        slow = sorted(zip(r["interactive_ttft"], r["interactive_started_s"]), reverse=True)[:4]
        slow_bulk = sorted(zip(r["bulk_seconds"], r["bulk_started_s"]), reverse=True)[:4]
        print(f"{name}: slowest first tokens (ms @ s): "
              + ", ".join(f"{1000 * t:.0f} @ {at:.1f}" for t, at in slow)
              + "; slowest bulk (s @ s): " + ", ".join(f"{t:.2f} @ {at:.1f}" for t, at in slow_bulk))
        if "profile" in r:
            print(f"  the daemon under load, sampled by py-spy (native frames, {NATIVE_RATE} Hz):")
            print("\n".join(f"    {line}" for line in r["profile"].splitlines()))
        if "slow_turns" in r:
            turns = r["slow_turns"]
            joined = (f", {turns['joins_of_2_or_more']} of them joins of 2 or more requests, median "
                      f"{turns['join_turn_median_ms']:.1f} ms" if turns["join_turn_median_ms"] else "")
            print(f"  {turns['count']} slow turns{joined}; the slowest:")
            for line in r["slow_turns"]["slowest"]:
                print(f"    {line}")
            print(f"  {turns['slow_first_texts']} slow interactive first texts; the slowest:")
            for line in turns["slowest_first_texts"]:
                print(f"    {line}")
    for name, r in runs.items():
        of = ratios(r)
        ttft, bulk = of["interactive_p95_vs_idle"], of["bulk_max_vs_solo"]
        r["targets"] = {**{key: round(value, 2) for key, value in of.items()},
                        "interactive_met": ttft <= 1.5, "bulk_met": bulk <= 2.0}
        print(f"{name}: interactive p95 within 1.5x idle: {'yes' if ttft <= 1.5 else 'no'} ({ttft:.2f}x); "
              f"every bulk request within 2x solo: {'yes' if bulk <= 2.0 else 'no'} ({bulk:.2f}x)")
    label = f"qwen2-{args.size}" + (f"-prompts{args.bulk_prompt_words}" if args.bulk_prompt_words else "")
    print(f"wrote {save('app_priority', label, result)}")


if __name__ == "__main__":
    main()
