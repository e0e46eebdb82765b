"""Remote entries when things go wrong, with real servers on loopback: the
backend down when the front starts, a hot-reload edit of the backend while a
stream is in flight, the backend killed mid-stream, and backends that hang
(a socket that accepts and then says nothing: no real server hangs on cue)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from support.daemon import daemon_in_thread, daemon_process, free_port, wait_until, write_registry
from support.remote import killed_mid_stream, reload, until_text, write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Tell me a long story."}]
DEAD = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there


def _backend_registry(tmp):
    return write_registry(tmp, [{"name": "tiny", "model": "qwen"}])


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backend")
    with daemon_process(_backend_registry(tmp), tmp) as daemon:
        yield daemon


class Front:
    """The front daemon and its registry file, rewritten by the tests."""

    def __init__(self, tmp, backends):
        self.tmp = tmp
        self.path = self.write(backends)

    def write(self, backends):
        models = [{"name": name, "backend": name, "remote_model": "tiny"} for name in backends]
        return write_front(self.tmp, backends, models)


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    holder = Front(tmp, {"studio": {"url": DEAD, "kind": "mlxd", "poll_interval_s": 1}})
    with daemon_in_thread(holder.path, tmp) as daemon:
        daemon.files = holder
        yield daemon


def chat(front, model="studio", **body):
    return httpx.post(
        f"{front.url}/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "max_tokens": 4, **body},
        timeout=60,
    )


def point(front, **backends):
    front.files.write(backends)
    return reload(front.url)


def backend_status(front, name):
    return next(b for b in front.status()["backends"] if b["name"] == name)


def test_a_backend_down_at_start_is_reported_and_its_names_answer_503(front):
    assert httpx.get(f"{front.url}/health", timeout=5).status_code == 200
    down = wait_until(lambda: backend_status(front, "studio")["reachable"] is False and backend_status(front, "studio"))
    assert "Cannot connect" in down["poll_error"]
    assert any("backend `studio`" in p for p in front.status()["health"]["problems"])
    for stream in (False, True):
        response = chat(front, stream=stream)
        assert response.status_code == 503
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "backend_unavailable" and "Cannot reach backend `studio`" in error["message"]
    assert front.model("studio")["active_leases"] == 0


def test_a_hot_reload_edit_of_the_backend_applies_and_is_reported(front, backend):
    report = point(front, studio={"url": backend.url + "/v1", "kind": "mlxd", "poll_interval_s": 1})
    assert report["backends"] == ["studio"] and "backends: studio" in report["summary"]
    assert chat(front).status_code == 200
    assert backend_status(front, "studio")["url"] == backend.url + "/v1"
    wait_until(lambda: backend_status(front, "studio")["reachable"] is True)


def test_a_url_edit_leaves_the_stream_in_flight_alone_and_moves_new_requests(front, backend):
    point(front, studio={"url": backend.url + "/v1", "kind": "mlxd"})
    body = {"model": "studio", "messages": MESSAGES, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        until_text(lines)
        point(front, studio={"url": DEAD, "kind": "mlxd"})
        assert chat(front).status_code == 503  # a new request goes to the new (dead) URL
        rest = list(lines)
    # Parsed, not grepped: a random model may well write the word "error".
    frames = [json.loads(line[len("data: "):]) for line in rest if line.startswith("data: {")]
    assert not [f for f in frames if "error" in f]
    assert '"finish_reason":"length"' in "".join(rest)
    assert [line for line in rest if line.startswith("data:")][-1] == "data: [DONE]"
    point(front, studio={"url": backend.url + "/v1", "kind": "mlxd"})


def test_a_backend_killed_mid_stream_ends_the_stream_cleanly(front, tmp_path):
    with daemon_process(_backend_registry(tmp_path), tmp_path) as doomed:
        point(front, doomed={"url": doomed.url + "/v1", "kind": "mlxd"})
        body = {"model": "doomed", "messages": MESSAGES, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        data = killed_mid_stream(front.url, body, doomed.process)
    assert '"error"' in data[-2] and "broke off the answer" in data[-2]
    assert data[-1] == "data: [DONE]"
    model = front.model("doomed")
    assert model["active_leases"] == 0
    status = backend_status(front, "doomed")
    assert status["in_flight"] == 0 and status["errors"] == 1
    assert chat(front, model="doomed").status_code == 503  # and nothing is retried
    point(front, studio={"url": DEAD, "kind": "mlxd"})


@contextlib.contextmanager
def silent_server(after: bytes = b"") -> Iterator[str]:
    """Accepts connections, reads the request, sends ``after`` and then
    nothing more until closed."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.recv(65536)
            conn.sendall(after)
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


STARTED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b'%x\r\ndata: {"choices":[{"index":0,"delta":{"content":"Once"}}]}\n\n\r\n'
    % len(b'data: {"choices":[{"index":0,"delta":{"content":"Once"}}]}\n\n')
)


def test_no_first_byte_in_time_is_a_504(front):
    with silent_server() as url:
        point(front, hung={"url": url, "timeouts": {"first_byte": 0.5}})
        for stream in (False, True):
            response = chat(front, model="hung", stream=stream)
            assert response.status_code == 504
            assert response.json()["error"]["code"] == "backend_timeout"
        assert front.model("hung")["active_leases"] == 0


def test_silence_after_the_first_output_is_a_504(front):
    with silent_server(STARTED) as url:
        point(front, stalls={"url": url, "timeouts": {"idle": 0.5}})
        response = chat(front, model="stalls")
        assert response.status_code == 504
        assert "sent nothing for 0.5 s" in response.json()["error"]["message"]
        with httpx.stream("POST", f"{front.url}/v1/chat/completions", timeout=30,
                          json={"model": "stalls", "messages": MESSAGES, "stream": True}) as stream:
            data = [line for line in stream.iter_lines() if line.startswith("data:")]
        assert '"content":"Once"' in data[1]
        assert '"backend_timeout"' in data[-2] and data[-1] == "data: [DONE]"
        assert front.model("stalls")["active_leases"] == 0
