"""Speech through mlxd against mlx-audio called directly, in the same run.

Real-time factor (RTF: seconds of audio per second of wall time; higher is
faster) for
- transcription: a sine-sweep WAV file of --seconds, sent as multipart to
  /v1/audio/transcriptions (json) / read with mlx-audio's ``load_audio`` and
  passed to ``model.generate`` directly;
- speech: a paragraph to /v1/audio/speech (pcm) / ``model.generate``.

Both sides seed MLX's random state before each call (as mlxd does per
request) and use a fixed temperature, so they do the same work; the calls
alternate, round by round; the ratio of the medians, daemon ÷ direct, is the
daemon's overhead (target >= 0.95). Beside it, the median of each round's
own ratio: on a host whose pace drifts (an H100's speech rounds moved by 4x
in one run) a round's two sides share the drift, so this one is the steadier
figure; `--calls N` times N calls in a row for each side of a round, which
evens out a short request's jitter. Audio is kept
within one 30 s Whisper window so both sides run one ``generate``.

    python bench/audio.py --quick          # tiny factory models, offline, ~1 min
    python bench/audio.py --size bench     # random models of the real ones' size
    python bench/audio.py --whisper DIR --tts DIR --seconds 30 --rounds 5

Prints a table and merges the figures into bench/results/audio.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import daemon, environment, reexec_with_openblas, save, table  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. A daemon serves several models behind one API, "
        "and speech shares the machine with chat.")
TEMPERATURE = 0.4


# Random-weight models of the real ones' order of size (Whisper base: 512
# wide, 6 layers; Soprano's LM: 512 wide), so that a request does the work a
# real one does and the daemon's fixed cost per request weighs what it would.
SIZES = {
    "tiny": ({}, {}),
    "bench": ({"n_state": 512, "n_head": 8, "n_layer": 6, "n_text_ctx": 448},
              {"hidden_size": 512, "num_hidden_layers": 8}),
}


def audio_models(size: str) -> tuple[Path, Path]:
    """The factory's Whisper and Soprano folders of ``size``, built once."""
    from mlxd.factory.audio import SopranoRecipe, WhisperRecipe, build_soprano, build_whisper

    whisper, soprano = SIZES[size]
    return build_whisper(WhisperRecipe(**whisper)), build_soprano(SopranoRecipe(**soprano))


def sweep(seconds: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * (200 + 900 * t / seconds) * t)).astype(np.float32)


def rate(run: Callable[[], float], calls: int = 1) -> float:
    """Seconds of audio per wall second of ``calls`` calls in a row."""
    started = time.perf_counter()
    audio_seconds = sum(run() for _ in range(calls))
    return audio_seconds / (time.perf_counter() - started)


def paired(direct: Callable[[], float], served: Callable[[], float], rounds: int,
           calls: int = 1) -> tuple[list[float], list[float]]:
    """Both warmed up, then ``calls`` calls of each per round, alternating
    which goes first: a shared machine's load drifts, and it then weighs on both."""
    direct(), served()
    d, m = [], []
    for i in range(rounds):
        first, second = (direct, served) if i % 2 == 0 else (served, direct)
        a, b = rate(first, calls), rate(second, calls)
        d.append(a if first is direct else b)
        m.append(b if first is direct else a)
    return d, m


def direct_stt(folder: Path, wav: Path, seconds: float) -> Callable[[], float]:
    import mlx.core as mx
    from mlx_audio.stt.utils import load, load_audio

    model = load(str(folder))

    def run() -> float:
        mx.random.seed(0)
        model.generate(load_audio(str(wav)), temperature=TEMPERATURE, return_timestamps=False)
        return seconds

    return run


def direct_tts(folder: Path) -> Callable[[], float]:
    import mlx.core as mx
    from mlx_audio.tts.utils import load_model

    model = load_model(folder)

    def run() -> float:
        mx.random.seed(0)
        samples = sum(int(np.asarray(r.audio).size) for r in model.generate(TEXT))
        return samples / model.sample_rate

    return run


def daemon_stt(client: httpx.Client, url: str, data: bytes, seconds: float) -> Callable[[], float]:
    def run() -> float:
        r = client.post(f"{url}/v1/audio/transcriptions", files={"file": ("sweep.wav", data)},
                       data={"model": "whisper", "temperature": str(TEMPERATURE)}, timeout=600)
        if r.is_error:  # the daemon's answer says why (a 400 once was a missing multipart parser)
            raise SystemExit(f"transcription through mlxd: {r.status_code} {r.text}")
        return seconds

    return run


def daemon_tts(client: httpx.Client | None, url: str, rate: int) -> Callable[[], float]:
    """``client`` None: a new one per call."""
    def run() -> float:
        with (client or httpx).stream("POST", f"{url}/v1/audio/speech", timeout=600,
                          json={"model": "tts", "input": TEXT, "voice": "alloy", "response_format": "pcm"}) as r:
            r.raise_for_status()
            size = sum(len(chunk) for chunk in r.iter_bytes())
        return size / 2 / rate

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny factory models, short audio, 2 rounds")
    parser.add_argument("--whisper", type=Path, help="a Whisper folder (default: the factory's tiny one)")
    parser.add_argument("--tts", type=Path, help="a Soprano folder (default: the factory's tiny one)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="the factory models' size, when no folder is given")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the test audio (<= 30)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1, help="calls in a row for each side of a round")
    parser.add_argument("--cases", nargs="+", choices=["transcription", "speech"],
                        default=["transcription", "speech"], help="which to measure (a GPU call is short)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = min(args.seconds, 8.0), 2
    reexec_with_openblas()

    from mlxd.engine.audio_files import write_file

    built_whisper, built_tts = audio_models(args.size)
    whisper = args.whisper or built_whisper
    tts = args.tts or built_tts
    data = write_file(sweep(args.seconds), 16000, "wav")
    rows, cases = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "sweep.wav"
        wav.write_bytes(data)
        direct = {"transcription": direct_stt(whisper, wav, args.seconds), "speech": direct_tts(tts)}
        models = [{"name": "whisper", "path": str(whisper), "kind": "transcription", "preload": True},
                  {"name": "tts", "path": str(tts), "kind": "speech", "preload": True}]
        # One client for every call, as an app holds one: a new httpx client
        # per call builds an SSL context each time (tens of ms, on the
        # daemon's side of the ratio though the daemon does none of it).
        with daemon(models) as url, httpx.Client() as client:
            from mlx_audio.tts.utils import load_config

            rate = int(load_config(tts).get("sample_rate", 24000))
            served = {"transcription": daemon_stt(client, url, data, args.seconds),
                      "speech": daemon_tts(client, url, rate)}
            for case in args.cases:
                d_all, m_all = paired(direct[case], served[case], args.rounds, args.calls)
                d, m = statistics.median(d_all), statistics.median(m_all)
                by_round = statistics.median(b / a for a, b in zip(d_all, m_all))
                cases[case] = {"direct_rtf": d, "mlxd_rtf": m, "ratio": m / d, "paired_ratio": by_round,
                               "direct_rounds": d_all, "mlxd_rounds": m_all}
                rows.append([case, f"{d:.2f}", f"{m:.2f}", f"{m / d:.3f}", f"{by_round:.3f}"])
                print(f"  {case}: direct {d_all}, mlxd {m_all}", flush=True)
    print(table(["case", "direct RTF", "mlxd RTF", "mlxd / direct", "median of rounds' mlxd / direct"], rows))
    result: dict[str, Any] = {"environment": environment(), "seconds": args.seconds, "rounds": args.rounds,
                              "calls": args.calls,
                              "whisper": str(whisper), "tts": str(tts), "cases": cases}
    key = "quick" if args.quick else "full" if args.size == "tiny" else f"full-{args.size}"
    print(f"-> {save('audio', key, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
