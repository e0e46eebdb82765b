"""Bounds of the HTTP server and the request path, end to end (real daemon,
tiny models): connections, slow clients, timeouts, prompt counts, the
tokenizer kept off the MLX worker, start-up errors, what the log records."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from support.daemon import daemon_in_thread, daemon_process, free_port, wait_until, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "Say hello"}]


def _closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing, or None if it kept the socket open."""
    sock.settimeout(within)
    received = b""
    try:
        while True:
            piece = sock.recv(65536)
            if not piece:
                return received
            received += piece
    except (TimeoutError, socket.timeout):
        return None
    except ConnectionResetError:
        return received


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    registry = write_registry(
        tmp,
        [{"name": "qwen", "model": "qwen", "preload": True, "max_context": 8192}],
        server={"max_connections": 40, "header_timeout_s": 1, "body_timeout_s": 1, "request_timeout_s": 3,
                "max_prompts": 4},
    )
    with daemon_process(registry, tmp, "--no-watch") as d:
        yield d


def test_a_slow_body_gets_408_and_the_connection_closed(limited):
    port = int(limited.url.rsplit(":", 1)[1])
    socks = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: 100000\r\n\r\n{\"model\":")
        socks.append(s)
    try:
        answers = [_closed_by_server(s, within=10) for s in socks]
    finally:
        for s in socks:
            s.close()
    assert all(a is not None for a in answers), "the server kept slow-body connections open"
    assert all(a.startswith(b"HTTP/1.1 408") and b"request_body_timeout" in a for a in answers)
    assert "Traceback" not in limited.log()
    assert httpx.post(f"{limited.url}/v1/chat/completions",
                      json={"model": "qwen", "messages": CHAT, "max_tokens": 2}, timeout=30).status_code == 200


def test_a_connection_that_never_finishes_its_headers_is_closed(limited):
    port = int(limited.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as silent, \
            socket.create_connection(("127.0.0.1", port)) as partial:
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0")
        assert _closed_by_server(silent, within=10) == b""
        assert _closed_by_server(partial, within=10) == b""


def test_connections_past_the_bound_are_refused_at_once(limited):
    port = int(limited.url.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    try:
        # The bound is 40: the rest are answered 503 and closed, not kept.
        refused = [a for a in (_closed_by_server(s, within=0.5) for s in socks[40:]) if a is not None]
        assert len(refused) >= 15
        assert all(a.startswith(b"HTTP/1.1 503") and b"too_many_connections" in a for a in refused)
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: httpx.get(f"{limited.url}/health", timeout=5).status_code == 200, timeout=15)


def test_a_client_timeout_cannot_outlast_the_server_limit(limited):
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 8000, "ignore_eos": True, "timeout": 1e6}
    answer = httpx.post(f"{limited.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 504, answer.text[:300]
    assert "3.0 seconds" in answer.json()["error"]["message"]


def test_a_client_may_ask_for_less_time(limited):
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 8000, "ignore_eos": True, "timeout": 0.5}
    answer = httpx.post(f"{limited.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 504 and "0.5 seconds" in answer.json()["error"]["message"]


def test_a_streams_own_timeout_ends_it_with_an_error_event(limited):
    # On the old code the timeout bounded only the wait for the model: the
    # stream ran on to its 8,000 tokens.
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 8000, "ignore_eos": True, "timeout": 1, "stream": True}
    began = time.monotonic()
    with httpx.stream("POST", f"{limited.url}/v1/chat/completions", json=body, timeout=120) as answer:
        lines = [line for line in answer.iter_lines() if line]
        assert answer.status_code == 200
    assert time.monotonic() - began < 2.5
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert "1.0 seconds" in error["message"] and error["type"] == "timeout_error"
    assert re.search(r"status=504 .*stream=True", limited.log(re.compile(r"status=504 .*stream=True")))


def test_completions_take_at_most_max_prompts(limited):
    url = f"{limited.url}/v1/completions"
    ok = httpx.post(url, json={"model": "qwen", "prompt": ["a", "b", "c", "d"], "max_tokens": 1}, timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 4
    over = httpx.post(url, json={"model": "qwen", "prompt": ["a"] * 5, "max_tokens": 1}, timeout=60)
    assert over.status_code == 400 and over.json()["error"]["param"] == "prompt"
    assert "At most 4 prompts" in over.json()["error"]["message"]


def test_an_aborted_stream_is_logged_with_the_tokens_it_produced(limited):
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{limited.url}/v1/chat/completions", json=body, timeout=60) as stream:
        frames = 0
        for line in stream.iter_lines():
            frames += line.startswith("data: ")
            if frames >= 6:
                break

    def logged() -> str | None:
        lines = [l for l in limited.log().splitlines() if "status=499" in l and "stream=True" in l]
        return lines[-1] if lines else None

    line = wait_until(logged, timeout=20)
    tokens_out = int(line.split("tokens_out=")[1].split()[0])
    tokens_in = int(line.split("tokens_in=")[1].split()[0])
    assert tokens_out >= 5 and tokens_in > 0


def test_a_whole_answer_cut_by_the_deadline_is_logged_with_the_tokens_it_produced(limited):
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 8000, "ignore_eos": True, "timeout": 1.5}
    answer = httpx.post(f"{limited.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 504

    def logged() -> str | None:
        lines = [l for l in limited.log().splitlines() if "status=504" in l and "stream=False" in l]
        return lines[-1] if lines else None

    line = wait_until(logged, timeout=20)
    # On the old code: tokens_in=0 tokens_out=0, whatever it had generated.
    assert int(line.split("tokens_out=")[1].split()[0]) >= 5 and int(line.split("tokens_in=")[1].split()[0]) > 0


def test_the_dashboard_and_the_cli_still_work_with_the_checks(limited):
    page = httpx.get(f"{limited.url}/", headers={"accept": "text/html"}, timeout=10)
    assert page.status_code == 200
    # The dashboard's own fetch is same-origin; a POST from it would carry that origin.
    own = httpx.post(f"{limited.url}/v1/models/qwen/load", json={}, headers={"origin": limited.url}, timeout=60)
    assert own.status_code == 200
    by_name = httpx.get(limited.url.replace("127.0.0.1", "localhost") + "/v1/status", timeout=10)
    assert by_name.status_code == 200
    cli = subprocess.run([sys.executable, "-m", "mlxd", "load", "qwen", "--url", limited.url],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert '"state": "loaded"' in cli.stdout


def test_allowed_hosts_admits_a_name(tmp_path):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}],
                              server={"allowed_hosts": ["studio.example"]})
    with daemon_in_thread(registry, tmp_path) as d:
        assert httpx.get(f"{d.url}/v1/models", headers={"host": "studio.example:8080"}).status_code == 200
        refused = httpx.get(f"{d.url}/v1/models", headers={"host": "other.example"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"


def test_tokenizing_does_not_wait_for_the_mlx_worker(tmp_path):
    # A prompt that is over max_context only once tokenized (it passes the
    # cheap length bound) is refused while the worker thread is busy with
    # something else: the tokenizer ran off it.
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen", "max_context": 512, "preload": True}])
    with daemon_in_thread(registry, tmp_path) as d:
        wait_until(lambda: d.model("qwen")["state"] == "loaded", timeout=60)
        release, started = threading.Event(), threading.Event()

        def occupy() -> None:
            started.set()
            release.wait(60)

        # The worker delivers a call's result to whichever loop made it.
        blocker = threading.Thread(target=lambda: asyncio.run(d.ctx.worker.call(occupy)))
        blocker.start()
        try:
            assert started.wait(30)
            body = {"model": "qwen", "messages": [{"role": "user", "content": "alpha beta " * 600}], "max_tokens": 2}
            answer = httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=20)
            assert answer.status_code == 400
            assert answer.json()["error"]["code"] == "context_length_exceeded"
            assert "tokens" in answer.json()["error"]["message"]
        finally:
            release.set()
            blocker.join(30)


def test_a_busy_port_is_one_line_and_exit_2(tmp_path):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(port), "--no-watch",
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=120,
        )
    assert done.returncode == 2
    lines = [l for l in done.stderr.splitlines() if l.startswith("mlxd:")]
    assert lines == [f"mlxd: error: port {port} on 127.0.0.1 is already in use (another mlxd?); stop it or pass --port"]
    assert "Traceback" not in done.stderr
    # Nothing ran before the check: no model was loaded, no server started.
    assert "serving" not in done.stderr and "Started server" not in done.stderr


def test_an_unusable_state_dir_is_one_line_and_exit_2(tmp_path):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}])
    not_a_dir = tmp_path / "state-file"
    not_a_dir.write_text("a file, not a folder")
    done = subprocess.run(
        [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(free_port()),
         "--no-watch", "--state-dir", str(not_a_dir / "inner")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [l for l in done.stderr.splitlines() if l.startswith("mlxd: error:")]
    assert len(errors) == 1 and "state directory" in errors[0] and str(not_a_dir / "inner") in errors[0]


@pytest.mark.parametrize("keys", [[""], ["  "], ["ok-key", ""]])
def test_an_empty_api_key_is_a_config_error_with_file_and_line(tmp_path, keys):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}], server={"api_keys": keys})
    done = subprocess.run([sys.executable, "-m", "mlxd", "check", str(registry)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert line.startswith(f"mlxd: error: {registry}:") and "api_keys" in line and "empty" in line


def test_an_empty_environment_key_list_does_not_open_a_keyed_daemon(tmp_path):
    from mlxd.settings import DaemonSettings, effective
    from mlxd.registry.loader import load_registry

    registry = load_registry(write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}],
                                            server={"api_keys": ["sk-file"]}))
    for value in ("", ",", " , "):
        settings = DaemonSettings(api_keys=value)
        assert effective(settings, registry.server).server.api_keys == ("sk-file",)


@pytest.mark.parametrize("flag", [["--api-key", ""], ["--api-key", "two words"]])
def test_an_api_key_flag_that_names_no_usable_key_stops_the_daemon_instead_of_opening_it(tmp_path, flag):
    # `--api-key "$KEY"` with $KEY unset served every caller without a key.
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}])
    done = subprocess.run(
        [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(free_port()), "--no-watch",
         "--state-dir", str(tmp_path / "state"), *flag], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("mlxd: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert ("names no key" if flag[1] == "" else "space inside") in errors[0]
    assert "two words" not in done.stderr


def test_an_empty_host_setting_is_refused_not_bound_to_every_interface(tmp_path):
    from mlxd.errors import ConfigError
    from mlxd.registry.loader import load_registry
    from mlxd.settings import DaemonSettings, effective

    registry = load_registry(write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}]))
    with pytest.raises(ConfigError, match="every interface"):
        effective(DaemonSettings(host=""), registry.server)
