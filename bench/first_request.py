"""What a model's first request pays against its later ones, per kind, with
an empty MLX kernel cache (after a boot on a CPU, on a fresh CUDA machine):
the kernels MLX compiles on first use land in the load when the model is
warmed up as it loads, in the first request otherwise.

    python bench/first_request.py                    # this tree
    python bench/first_request.py --baseline DIR     # and another checkout, in turn

Factory models (the tiny embedder, reranker, Whisper, Soprano and vision
model); each tree gets a daemon of its own with a new kernel cache, loads
every model (timed), then sends each the same request three times. Prints a
table and merges the figures into bench/results/first_request.json.
"""

from __future__ import annotations

import argparse
import base64
import io
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.common import daemon, environment, reexec_with_openblas, save, table  # noqa: E402

REQUESTS = 3


def sine_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype(np.int16).tobytes())
    return out.getvalue()


def picture() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.random.RandomState(1).randint(0, 256, (64, 80, 3), dtype=np.uint8)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def models() -> list[dict[str, Any]]:
    from mlxd.factory.audio import build_soprano, build_whisper
    from mlxd.factory.encoders import EncoderRecipe, build_encoder
    from mlxd.factory.vision import VisionRecipe, build_vision_model

    return [
        {"name": "embedding", "path": str(build_encoder(EncoderRecipe("embedding"))), "kind": "embedding"},
        {"name": "rerank", "path": str(build_encoder(EncoderRecipe("rerank"))), "kind": "rerank"},
        {"name": "transcription", "path": str(build_whisper()), "kind": "transcription"},
        {"name": "speech", "path": str(build_soprano()), "kind": "speech"},
        {"name": "vision", "path": str(build_vision_model(VisionRecipe(size="tiny", seed=0)))},
    ]


def send(client: httpx.Client, name: str, wav: bytes, image: str) -> None:
    if name == "embedding":
        reply = client.post("/v1/embeddings", json={"model": name, "input": ["a short one", "and a longer text"]})
    elif name == "rerank":
        reply = client.post("/v1/rerank", json={"model": name, "query": "weather", "documents": ["sunny", "stocks"]})
    elif name == "transcription":
        reply = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav, "audio/wav")},
                            data={"model": name})
    elif name == "speech":
        reply = client.post("/v1/audio/speech", json={"model": name, "input": "Hello there. How are you?"})
    else:
        reply = client.post("/v1/chat/completions", json={"model": name, "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": image}}]}]})
    reply.raise_for_status()


def run(entries: list[dict[str, Any]], cwd: Path | None) -> dict[str, dict[str, Any]]:
    wav, image = sine_wav(), picture()
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mlxd-kernels-") as kernels:
        env = {"TMPDIR": kernels, "MLX_PTX_CACHE_DIR": str(Path(kernels) / "ptx")}
        with daemon(entries, env=env, cwd=cwd) as url, httpx.Client(base_url=url, timeout=600) as client:
            for entry in entries:
                started = time.perf_counter()
                client.post(f"/v1/models/{entry['name']}/load", json={}).raise_for_status()
                out[entry["name"]] = {"load_s": time.perf_counter() - started, "requests_s": []}
            for entry in entries:
                for _ in range(REQUESTS):
                    started = time.perf_counter()
                    send(client, entry["name"], wav, image)
                    out[entry["name"]]["requests_s"].append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="also run mlxd from this checkout, in turn")
    args = parser.parse_args()
    reexec_with_openblas()
    entries = models()
    trees = {"mlxd": None, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    results = {label: run(entries, cwd) for label, cwd in trees.items()}
    rows = []
    for label, kinds in results.items():
        for name, f in kinds.items():
            first, later = f["requests_s"][0], min(f["requests_s"][1:])
            rows.append([label, name, f"{f['load_s']:.2f}", f"{first:.3f}", f"{later:.3f}", f"{first / later:.1f}x"])
    print(table(["daemon", "model", "load s", "first request s", "later s", "first / later"], rows))
    print(f"wrote {save('first_request', 'tiny', {'environment': environment(), 'runs': results})}")


if __name__ == "__main__":
    main()
