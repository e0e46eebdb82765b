"""Bad uploads and oversized asks: each a clear 4xx in OpenAI's error shape,
answered from the header before any decoding or lease, the daemon healthy after."""

from __future__ import annotations

import gc
import io
import time

import httpx
import numpy as np
import psutil
import pytest
import soundfile

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file

pytestmark = pytest.mark.mlx


def silent_flac(seconds: int, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with soundfile.SoundFile(out, "w", samplerate=rate, channels=1, format="FLAC", subtype="PCM_16") as f:
        block = np.zeros(rate * 600, dtype=np.int16)
        for _ in range(seconds // 600):
            f.write(block)
    return out.getvalue()


def refused(http: httpx.Client, data: bytes, name: str = "a.wav", **form: str) -> httpx.Response:
    return http.post("/v1/audio/transcriptions", files={"file": (name, data)}, data={"model": "whisper", **form})


def test_bad_files_are_clear_400s_before_any_load(audio_daemon) -> None:
    wav = write_file(sweep(1.0), RATE, "wav")
    cases = {
        "truncated_file": wav[: len(wav) // 3],
        "invalid_file_format": b"%PDF-1.4 this is not audio at all" * 10,
        "empty_file": b"",
        "audio_too_long": silent_flac(7200),  # two hours of silence, 180 kB
        "unsupported_format": b"\x00\x00\x00\x20ftypM4A " + b"\x00" * 64,
    }
    with httpx.Client(base_url=audio_daemon.url, timeout=30) as http:
        for code, data in cases.items():
            started = time.monotonic()
            r = refused(http, data)
            assert r.status_code == 400, (code, r.text)
            error = r.json()["error"]
            assert (error["code"], error["param"], error["type"]) == (code, "file", "invalid_request_error")
            assert time.monotonic() - started < 5, code
        assert refused(http, wav, response_format="xml").json()["error"]["param"] == "response_format"
        r = http.post("/v1/audio/transcriptions", data={"model": "whisper"})
        assert r.status_code in (400, 415) and "file" in r.json()["error"]["message"]
        r = http.post("/v1/audio/speech", json={"model": "soprano", "input": "x" * 5000, "voice": "alloy"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "string_above_max_length"
        r = http.post("/v1/audio/speech", json={"model": "soprano", "input": "hi", "speed": 2.0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "speed"
        assert http.get("/health").status_code == 200
    # None of it needed a model.
    assert audio_daemon.model("whisper")["state"] == "unloaded"


def test_a_100_mb_upload_is_refused_at_the_door(audio_daemon) -> None:
    """The daemon runs in this process: its memory is this process's."""
    gc.collect()
    rss = psutil.Process().memory_info().rss
    big = b"RIFF" + b"\x00" * (100 << 20)
    started = time.monotonic()
    with httpx.Client(base_url=audio_daemon.url, timeout=30) as http:
        try:
            r = refused(http, big)
            assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
        except httpx.WriteError:
            pass  # the daemon answered 413 and closed before the client finished sending
        assert time.monotonic() - started < 10
        assert http.get("/health").status_code == 200
    # Between the audio cap (25 MB) and the body cap (32 MB): the audio cap's own 413.
    with httpx.Client(base_url=audio_daemon.url, timeout=30) as http:
        r = refused(http, b"RIFF" + b"\x00" * (26 << 20))
        assert r.status_code == 413 and "max_audio_bytes" in r.json()["error"]["message"]
    del big
    gc.collect()
    from mlxd.engine.memory import malloc_trim

    malloc_trim()  # glibc keeps freed pages until trimmed (platform notes)
    # Neither upload is kept: memory is back within 64 MB of where it was.
    assert psutil.Process().memory_info().rss - rss < 64 << 20
