"""Speech entries on a backend: a front daemon whose entries are the audio
daemon's models (another mlxd), a gated backend that sends its audio in two
parts on the test's cue, one that hangs, one that is not there. The voices
list has every speech entry's voices, remote ones asked of their backend
(within a bounded time; a failing backend left out); relayed speech is the
backend's bytes, passed through as they arrive."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file
from support.daemon import Daemon, daemon_in_thread, free_port, wait_until, write_registry

pytestmark = pytest.mark.mlx

TEXT = "Hello there. This is a second sentence."


class GatedBackend:
    """``POST /v1/audio/speech``: a first part, then (once ``release`` is
    set, or after 20 s) the rest; for model ``stall``, nothing more for 20 s.
    ``GET /v1/audio/voices``: two voices; for model ``hang``, nothing for 30 s."""

    FIRST, REST = b"first part of the audio|", b"the rest of it"
    # ``POST /v1/audio/transcriptions`` (streamed): a first delta event, then
    # (once ``release_transcript`` is set, or after 20 s) the done event; for
    # model ``stall``, the first bytes of an event and nothing more for 20 s.
    DELTA = b'data: {"type": "transcript.text.delta", "delta": "Hello"}\n\n'
    DONE = b'data: {"type": "transcript.text.done", "text": "Hello"}\n\n'

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release_transcript = threading.Event()
        self.transcript_released_in_time: bool | None = None
        self.released_in_time: bool | None = None
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if "model=hang" in self.path:
                    time.sleep(30)
                    return
                body = json.dumps({"object": "list", "data": [{"id": v, "name": v, "model": "gated"}
                                                              for v in ("alto", "bass")]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.path.endswith("/audio/transcriptions"):
                    self._transcript()
                    return
                model = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))["model"]
                self.send_response(200)
                self.send_header("content-type", "audio/pcm")
                self.send_header("x-sample-rate", "24000")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self._chunk(backend.FIRST)
                if model == "stall":
                    time.sleep(20)
                    return
                backend.released_in_time = backend.release.wait(20)
                self._chunk(backend.REST)
                self._chunk(b"")

            def _transcript(self) -> None:
                upload = self.rfile.read(int(self.headers.get("content-length", "0")))
                assert b'name="stream"' in upload and (b"gated" in upload or b"stall" in upload)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self._chunk(backend.DELTA)
                if b"stall" in upload:
                    self._chunk(backend.DONE[:20])  # an event begun, then silence
                    time.sleep(20)
                    return
                backend.transcript_released_in_time = backend.release_transcript.wait(20)
                self._chunk(backend.DONE)
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> GatedBackend:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gated() -> Iterator[GatedBackend]:
    with GatedBackend() as backend:
        yield backend


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory, audio_daemon: Daemon, gated: GatedBackend,
          soprano_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("audio-front")
    registry = write_registry(tmp, [
        {"name": "near-soprano", "path": str(soprano_dir), "kind": "speech"},
        {"name": "far-soprano", "backend": "up", "remote_model": "soprano", "kind": "speech"},
        {"name": "far-whisper", "backend": "up", "remote_model": "whisper", "kind": "transcription"},
        {"name": "gated-speech", "backend": "gate", "remote_model": "gated", "kind": "speech"},
        {"name": "gated-whisper", "backend": "gate", "remote_model": "gated", "kind": "transcription"},
        {"name": "slow-speech", "backend": "gate", "remote_model": "hang", "kind": "speech"},
        {"name": "stalled-speech", "backend": "gate", "remote_model": "stall", "kind": "speech"},
        {"name": "stalled-whisper", "backend": "gate", "remote_model": "stall", "kind": "transcription"},
        {"name": "gone-speech", "backend": "gone", "remote_model": "soprano", "kind": "speech"},
    ], backends={
        "up": {"url": audio_daemon.url + "/v1", "kind": "mlxd"},
        "gate": {"url": gated.url, "timeouts": {"first_byte": 1, "idle": 2}},
        "gone": {"url": f"http://127.0.0.1:{free_port()}/v1"},
    })
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon


def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_voices_include_remote_speech_entries_and_leave_out_failing_backends(front, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="mlxd.requests"):
        started = time.monotonic()
        listed = httpx.get(front.url + "/v1/audio/voices", timeout=30)
        took = time.monotonic() - started
    assert listed.status_code == 200, listed.text
    assert sorted((v["model"], v["id"]) for v in listed.json()["data"]) == [
        ("far-soprano", "default"), ("gated-speech", "alto"), ("gated-speech", "bass"),
        ("near-soprano", "default"), ("stalled-speech", "alto"), ("stalled-speech", "bass")]
    # The hanging backend is waited on for its first_byte (1 s), at once with the others.
    assert took < 4, took
    left_out = {r.getMessage().split()[2] for r in caplog.records if "left out" in r.getMessage()}
    assert left_out == {"slow-speech", "gone-speech"}
    one = httpx.get(front.url + "/v1/audio/voices", params={"model": "far-soprano"}, timeout=30).json()
    assert one["data"] == [{"id": "default", "name": "default", "model": "far-soprano"}]
    gone = httpx.get(front.url + "/v1/audio/voices", params={"model": "gone-speech"}, timeout=30)
    assert gone.status_code == 200 and gone.json()["data"] == []
    refused = httpx.get(front.url + "/v1/audio/voices", params={"model": "far-whisper"}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"


def test_relayed_speech_is_the_backends_bytes_and_headers(front, audio_daemon) -> None:
    for fmt in ("pcm", "wav"):
        with client(audio_daemon).audio.speech.with_streaming_response.create(
                model="soprano", voice="alloy", input=TEXT, response_format=fmt) as direct:
            expected, expected_headers = direct.read(), direct.headers
        with client(front).audio.speech.with_streaming_response.create(
                model="far-soprano", voice="alloy", input=TEXT, response_format=fmt) as relayed:
            got, headers = relayed.read(), relayed.headers
        assert got == expected and len(got) > 1000
        assert headers["content-type"] == expected_headers["content-type"]
        assert headers["x-sample-rate"] == expected_headers["x-sample-rate"] == "32000"


def test_relayed_speech_streams_each_part_as_it_arrives(front, gated) -> None:
    """The gated backend holds its second part until the test has read the
    first through the front: a front that buffered the body would wait."""
    with httpx.stream("POST", front.url + "/v1/audio/speech", timeout=60,
                      json={"model": "gated-speech", "input": "Hi.", "voice": "alto", "response_format": "pcm"}
                      ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "audio/pcm" and response.headers["x-sample-rate"] == "24000"
        parts = response.iter_raw()
        first = next(parts)
        assert not gated.release.is_set()
        gated.release.set()
        body = first + b"".join(parts)
    assert first == GatedBackend.FIRST
    assert body == GatedBackend.FIRST + GatedBackend.REST
    assert gated.released_in_time is True


def test_a_backends_refusal_is_the_answer_before_any_byte(front) -> None:
    refused = httpx.post(front.url + "/v1/audio/speech", json={"model": "far-soprano", "input": "Hi.",
                                                               "speed": 2.0}, timeout=60)
    assert refused.status_code == 400 and "speed" in refused.json()["error"]["message"]
    gone = httpx.post(front.url + "/v1/audio/speech", json={"model": "gone-speech", "input": "Hi."}, timeout=60)
    assert gone.status_code == 503 and gone.json()["error"]["message"].startswith("Cannot reach backend `gone`")
    status = httpx.get(front.url + "/v1/status", timeout=30).json()
    assert all(b["in_flight"] == 0 for b in status["backends"])


def in_flight(front: Daemon, backend: str) -> int:
    status = httpx.get(front.url + "/v1/status", timeout=30).json()
    return next(b["in_flight"] for b in status["backends"] if b["name"] == backend)


def test_a_stalled_backend_is_cut_at_its_idle_timeout_and_the_exchange_ends(front) -> None:
    """Silent for longer than ``timeouts.idle`` (2 s) once its audio began:
    the front breaks the answer off (the client sees a cut body, not a whole
    one) and ends the exchange; a client that leaves mid-audio ends it too,
    at once, not when the backend finishes."""
    body = {"model": "stalled-speech", "input": "Hi.", "response_format": "pcm"}
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", front.url + "/v1/audio/speech", json=body, timeout=60) as response:
            assert response.status_code == 200
            b"".join(response.iter_raw())
    assert 2 <= time.monotonic() - started < 10
    wait_until(lambda: in_flight(front, "gate") == 0, timeout=5)
    with httpx.stream("POST", front.url + "/v1/audio/speech", json=body, timeout=60) as response:
        parts = response.iter_raw()  # held: a dropped iterator closes the connection
        assert next(parts) == GatedBackend.FIRST
        assert in_flight(front, "gate") == 1
    wait_until(lambda: in_flight(front, "gate") == 0, timeout=1.5)


def test_word_timestamps_are_relayed_from_the_backend(front, audio_daemon) -> None:
    clip = ("sweep.wav", write_file(sweep(), RATE, "wav"))
    asked = {"response_format": "verbose_json", "temperature": 0.4, "timestamp_granularities": ["word"]}
    direct = client(audio_daemon).audio.transcriptions.create(model="whisper", file=clip, **asked)
    relayed = client(front).audio.transcriptions.create(model="far-whisper", file=clip, **asked)
    assert direct.words and relayed.words == direct.words


def test_a_streamed_transcript_is_relayed_event_by_event(front, gated) -> None:
    """The gated backend holds its done event until the test has read the
    first delta through the front: a front that relayed the answer whole would wait."""
    clip = {"file": ("sweep.wav", write_file(sweep(), RATE, "wav"), "audio/wav")}
    with httpx.stream("POST", front.url + "/v1/audio/transcriptions", files=clip, timeout=60,
                      data={"model": "gated-whisper", "stream": "true"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        parts = response.iter_raw()
        first = next(parts)
        assert not gated.release_transcript.is_set()
        gated.release_transcript.set()
        body = first + b"".join(parts)
    assert first == GatedBackend.DELTA and body == GatedBackend.DELTA + GatedBackend.DONE
    assert gated.transcript_released_in_time is True
    wait_until(lambda: in_flight(front, "gate") == 0, timeout=5)


def test_a_transcript_the_backend_breaks_off_ends_with_an_error_event(front) -> None:
    """Silent past ``timeouts.idle`` (2 s) halfway through an event: the
    client gets the whole events before it, then an error event, and a
    stream that ends cleanly; not the half event, nor a cut body."""
    clip = {"file": ("sweep.wav", write_file(sweep(), RATE, "wav"), "audio/wav")}
    with httpx.stream("POST", front.url + "/v1/audio/transcriptions", files=clip, timeout=60,
                      data={"model": "stalled-whisper", "stream": "true"}) as response:
        assert response.status_code == 200
        body = response.read()
    events = [json.loads(part[6:]) for part in body.decode().split("\n\n") if part]
    assert events[0] == json.loads(GatedBackend.DELTA[6:])
    assert [e["type"] for e in events] == ["transcript.text.delta", "error"]
    assert "gate" in events[1]["error"]["message"]
    wait_until(lambda: in_flight(front, "gate") == 0, timeout=5)
