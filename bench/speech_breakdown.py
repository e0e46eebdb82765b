"""Where a speech request's time goes: the same synthesis, layer by layer.

bench/audio.py measures mlxd ÷ mlx-audio direct as one figure. This one runs
the same text through each layer the daemon adds, in one process except the
last, so the layer that costs is the one whose row jumps:

1. ``direct``: mlx-audio's ``model.generate``, main thread (bench/audio.py's direct side);
2. ``sentences``: mlxd's own stepping of the same calls (``engine.audio_soprano.sentences``), main thread;
3. ``thread``: the same, on a plain thread of its own;
4. ``worker``: the daemon's ``SpeechEngine.synthesise`` on an ``MlxWorker`` (no HTTP);
5. ``http``: ``POST /v1/audio/speech`` (pcm) to a ``mlxd serve`` on the same model, one client held;
6. ``http_new_client``: the same with a new httpx client per call (bench/audio.py's way until it held one).

Each round runs every layer once, in rotating order (a drifting load weighs
on all of them); the table gives the median seconds per call and its ratio
to ``direct``.

    python bench/speech_breakdown.py               # the factory's tiny Soprano, 5 rounds
    python bench/speech_breakdown.py --size bench  # a random model of the real one's size
    python bench/speech_breakdown.py --tts DIR --rounds 3

Prints a table and merges the figures into bench/results/speech_breakdown.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.audio import SIZES, TEXT, audio_models, daemon_tts  # noqa: E402
from bench.common import daemon, environment, reexec_with_openblas, save, table  # noqa: E402
from bench.profiling import sampled  # noqa: E402


def timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    samples = run()
    return time.perf_counter() - started, samples


def layers(folder: Path, url: str, rate: int, client: httpx.Client) -> dict[str, Callable[[], int]]:
    import mlx.core as mx
    from mlx_audio.tts.utils import load_model

    from mlxd.engine.audio import SpeechEngine
    from mlxd.engine.audio_soprano import sentences
    from mlxd.engine.worker import SKIP, MlxWorker
    from mlxd.registry.model import ModelSpec

    model = load_model(folder)

    def direct() -> int:
        mx.random.seed(0)
        return sum(int(np.asarray(r.audio).size) for r in model.generate(TEXT))

    def stepped() -> int:
        mx.random.seed(0)
        return sum(int(c.size) for c in sentences(model, TEXT) if c is not SKIP)

    def on_thread() -> int:
        out: list[int] = []
        t = threading.Thread(target=lambda: out.append(stepped()))
        t.start()
        t.join()
        return out[0]

    loop = asyncio.new_event_loop()
    worker = MlxWorker().start()
    engine_model = loop.run_until_complete(worker.call(load_model, folder))
    engine = SpeechEngine(ModelSpec(name="tts", path=folder, source=str(folder), kind="speech"), worker, engine_model,
                          load_bytes=0, load_seconds=0.0)

    async def through_worker() -> int:
        made = 0
        async for chunk in engine.synthesise(TEXT):
            made += int(chunk.size)
        return made

    served = daemon_tts(client, url, rate)
    fresh = daemon_tts(None, url, rate)
    return {
        "direct": direct,
        "sentences": stepped,
        "thread": on_thread,
        "worker": lambda: loop.run_until_complete(through_worker()),
        "http": lambda: int(served() * rate),
        # What bench/audio.py measured before: a new httpx client (and SSL context) per call.
        "http_new_client": lambda: int(fresh() * rate),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tts", type=Path, help="a Soprano folder (default: the factory's tiny one)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="the factory model's size, when no folder is given")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="then N more requests through HTTP with the daemon sampled by py-spy "
                             "(where a request's time beyond the synthesis goes)")
    args = parser.parse_args(argv)
    reexec_with_openblas()

    from mlx_audio.tts.utils import load_config

    tts = args.tts or audio_models(args.size)[1]
    rate = int(load_config(tts).get("sample_rate", 24000))
    runs: dict[str, list[float]] = {}
    samples: dict[str, int] = {}
    with daemon([{"name": "tts", "path": str(tts), "kind": "speech", "preload": True}]) as url, \
            httpx.Client() as client:
        calls = layers(tts, url, rate, client)
        names = list(calls)
        for name in names:  # warm every layer once
            calls[name]()
        for i in range(args.rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                seconds, made = timed(calls[name])
                runs.setdefault(name, []).append(seconds)
                samples[name] = made
        if args.profile:
            # The daemon's side of the http layer: where its time beyond the synthesis goes.
            with sampled(Path("bench/results/speech-profile.txt"), native=False, rate=400) as sampling:
                for _ in range(args.profile):
                    calls["http"]()
            print(f"the daemon through {args.profile} requests, sampled by py-spy (400 Hz):")
            print("\n".join(f"  {line}" for line in sampling.report.splitlines()), flush=True)
    base = statistics.median(runs["direct"])
    rows, figures = [], {}
    for name in names:
        median = statistics.median(runs[name])
        figures[name] = {"median_s": median, "ratio_to_direct": median / base, "rounds": runs[name],
                         "samples": samples[name]}
        rows.append([name, f"{median * 1000:.1f}", f"{median / base:.2f}", str(samples[name])])
    print(table(["layer", "median ms", "÷ direct", "samples"], rows))
    result: dict[str, Any] = {"environment": environment(), "rounds": args.rounds, "tts": str(tts),
                              "layers": figures}
    print(f"-> {save('speech_breakdown', args.size if args.tts is None else 'given', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
