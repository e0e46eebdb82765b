"""Bad uploads and oversized asks: each a clear 4xx in OpenAI's error shape,
answered from the header before any decoding or lease, the daemon healthy after."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import socket
import time

import httpx
import numpy as np
import psutil
import pytest
import soundfile

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file
from support.daemon import daemon_in_thread, wait_until, write_registry

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


def _never_read(port: int, path: str, body: dict) -> socket.socket:
    """A request from a client that never reads its answer: a small receive
    buffer, so the daemon's sends block once the kernel's are full."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def test_a_speech_client_that_stops_reading_gives_the_model_back(tmp_path, soprano_dir) -> None:
    # Speech is made as the client reads it: one that stopped reading (its
    # socket open) held the entry's only slot for as long as it stayed, and
    # every other speech request got a 504.
    registry = write_registry(tmp_path, [{"name": "soprano", "path": str(soprano_dir), "kind": "speech"}],
                              server={"send_timeout_s": 2})
    with daemon_in_thread(registry, tmp_path) as daemon:
        port = int(daemon.url.rsplit(":", 1)[1])
        body = {"model": "soprano", "input": "Hello there, how are you doing today. " * 25, "response_format": "pcm"}
        with contextlib.closing(_never_read(port, "/v1/audio/speech", body)):
            wait_until(lambda: daemon.model("soprano")["active_leases"] == 1, timeout=60)
            wait_until(lambda: daemon.model("soprano")["active_leases"] == 0, timeout=60)
            other = httpx.post(f"{daemon.url}/v1/audio/speech", timeout=60,
                               json={"model": "soprano", "input": "Hi.", "response_format": "wav"})
            assert other.status_code == 200 and other.content.startswith(b"RIFF")
            assert daemon.model("soprano")["engine"]["in_flight"] == 0


def test_a_speech_request_is_listed_under_way_and_cancelled_by_id(tmp_path, soprano_dir) -> None:
    # Audio requests were missing from /v1/requests (and the dashboard): a
    # long synthesis could be neither seen nor cancelled as a chat can.
    registry = write_registry(tmp_path, [{"name": "soprano", "path": str(soprano_dir), "kind": "speech"}])
    with daemon_in_thread(registry, tmp_path) as daemon:
        body = {"model": "soprano", "input": "Hello there, how are you doing today.\n" * 25, "response_format": "pcm"}
        with httpx.stream("POST", f"{daemon.url}/v1/audio/speech", json=body, timeout=120,
                          headers={"X-Request-Id": "long-speech"}) as answer:
            chunks = answer.iter_bytes()
            assert next(chunks)  # its first sentence is out: it is under way
            listed = httpx.get(f"{daemon.url}/v1/requests", timeout=10).json()["data"]
            assert [(r["id"], r["model"], r["surface"], r["stream"]) for r in listed] == [
                ("long-speech", "soprano", "speech", True)]
            cancel = httpx.post(f"{daemon.url}/v1/requests/long-speech/cancel", timeout=10)
            assert cancel.status_code == 200 and cancel.json()["cancelled"] is True
            b"".join(chunks)  # the rest: the stream ends after the sentence being made
        wait_until(lambda: daemon.model("soprano")["active_leases"] == 0, timeout=30)
        assert httpx.get(f"{daemon.url}/v1/requests", timeout=10).json()["data"] == []
        row = wait_until(lambda: next(iter(httpx.get(f"{daemon.url}/v1/activity", params={"request_id": "long-speech"},
                                                     timeout=10).json()["data"]), None), timeout=10)
        assert row["status"] == 499 and row["error"] == "cancelled"
