"""An embedding, rerank, transcription or speech model is warmed up as it
loads, as a text model is: its first request compiles no kernel, a
transcription's fallback temperatures included.

With an empty kernel cache (after a boot on a CPU, a fresh CUDA machine) MLX
compiles a kernel per fused operation on first use,
about 0.5 s each on this CPU; the first embedding request took 0.82 s
against 0.02 s, the tiny speech model's 2.1 s against 0.1 s."""

from __future__ import annotations


import httpx
import pytest
from support.daemon import daemon_process, write_registry
from support.kernel_cache import KernelCache

from mlxd.factory.audio import build_soprano, build_whisper
from mlxd.factory.encoders import EncoderRecipe, build_encoder

pytestmark = pytest.mark.mlx


def test_each_kinds_first_request_compiles_no_kernel_after_its_load(tmp_path):
    kernels = KernelCache(tmp_path / "tmp")
    registry = write_registry(tmp_path, [
        {"name": "embed", "path": str(build_encoder(EncoderRecipe("embedding"))), "kind": "embedding"},
        {"name": "rerank", "path": str(build_encoder(EncoderRecipe("rerank"))), "kind": "rerank"},
        {"name": "whisper", "path": str(build_whisper()), "kind": "transcription"},
        {"name": "soprano", "path": str(build_soprano()), "kind": "speech"},
    ])
    with daemon_process(registry, tmp_path, "--no-watch", env=kernels.env) as d:
        def load(name: str) -> None:
            assert httpx.post(f"{d.url}/v1/models/{name}/load", json={}, timeout=300).status_code == 200

        for name in ("embed", "rerank", "soprano"):
            load(name)
        warm = kernels.compiled()
        assert warm, "the loads' warm-ups compiled their kernels under TMPDIR"
        load("whisper")
        assert kernels.compiled() - warm, "whisper's warm-up compiled its kernels at its load"
        warm = kernels.compiled()
        # Status tells the warm-ups as a text model's: in the load, done, how long.
        models = {m["name"]: m for m in httpx.get(f"{d.url}/v1/status", timeout=30).json()["models"]}
        for name in ("embed", "rerank", "whisper", "soprano"):
            assert models[name]["warmup_mode"] == "load" and models[name]["warmup_done"] is True, name
            assert models[name]["warmup_seconds"] > 0, name
        # Whisper's includes its fallback temperatures, with an empty kernel cache a second or more.
        assert models["whisper"]["warmup_seconds"] > models["rerank"]["warmup_seconds"]

        def new_kernels() -> set[str]:
            return kernels.compiled() - warm

        reply = httpx.post(f"{d.url}/v1/embeddings", timeout=120,
                           json={"model": "embed", "input": ["a short one", "and a somewhat longer text than that"]})
        assert reply.status_code == 200 and len(reply.json()["data"]) == 2
        assert new_kernels() == set(), "embedding"
        reply = httpx.post(f"{d.url}/v1/rerank", timeout=120,
                           json={"model": "rerank", "query": "weather", "documents": ["sunny", "stock prices"]})
        assert reply.status_code == 200 and len(reply.json()["results"]) == 2
        assert new_kernels() == set(), "rerank"
        reply = httpx.post(f"{d.url}/v1/audio/speech", timeout=300,
                           json={"model": "soprano", "input": "Hello there. How are you?"})
        assert reply.status_code == 200 and len(reply.content) > 1000
        assert new_kernels() == set(), "speech"
        # Random weights decode badly, so every window falls back through
        # the ladder's temperatures, each a kernel of its own (whisper_ladder.py).
        reply = httpx.post(f"{d.url}/v1/audio/transcriptions", timeout=300, data={"model": "whisper"},
                           files={"file": ("tone.wav", tone_wav(), "audio/wav")})
        assert reply.status_code == 200, reply.text
        assert new_kernels() == set(), "transcription"


def tone_wav() -> bytes:
    """Two seconds of a 440 Hz tone, 16 kHz mono WAV."""
    import io

    import numpy as np
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, 0.3 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000), 16000, format="WAV")
    return out.getvalue()


def test_whispers_ladder_is_warmed_once_per_kernel_cache(tmp_path, monkeypatch):
    """The fallback temperatures are decoded at a load only while the kernel
    cache holds no note that they were: a second load skips them (they cost
    the tiny Whisper's load a second on this CPU, compiled or not)."""
    from mlx_audio.stt.utils import load_model

    from mlxd.engine.whisper_ladder import warm_ladder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    path = build_whisper()
    model = load_model(path)
    assert warm_ladder(model, "whisper", path) is not None, "an empty cache: the ladder is decoded"
    assert list(tmp_path.rglob("mlxd-warmed/*")), "and noted beside the kernels"
    assert warm_ladder(model, "whisper", path) is None, "noted: not again"


def test_a_failing_warm_up_is_logged_and_the_load_stands(tmp_path, caplog):
    from mlxd.engine.lifecycle import warm_after_load
    from mlxd.registry.model import ModelSpec

    def warm() -> None:
        raise ValueError("this architecture has no such layer")

    with caplog.at_level("WARNING", logger="mlxd.engine.lifecycle"):
        report = warm_after_load(ModelSpec(name="odd", path=tmp_path, source=str(tmp_path)), warm)
    assert "warming up odd failed" in caplog.text and "no such layer" in caplog.text
    assert "no such layer" in report.error, "status says so too"
