"""`mlxd serve` as a real process: exit statuses, signals, locks, auth, logs."""

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
from support.daemon import daemon_process, free_port, signal_mask, wait_until, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "List the files in the folder"}]


def run_cli(*args, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )


def test_config_error_exits_2_with_file_line_and_key(tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text("manager:\n  memory_budget: 2GB\nmodels:\n  - name: a\n    path: /nowhere\n    max_contxt: 10\n")
    result = run_cli("serve", "--config", str(bad), "--port", str(free_port()),
                     env={"MLXD_STATE_DIR": str(tmp_path / "state")})
    assert result.returncode == 2
    lines = [l for l in result.stderr.splitlines() if l.startswith("mlxd: error:")]
    assert len(lines) == 1, result.stderr
    assert f"{bad}:6" in lines[0] and "max_contxt" in lines[0]
    assert "Traceback" not in result.stderr


def test_check_command_validates_without_serving(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    ok = run_cli("check", str(registry))
    assert ok.returncode == 0 and "a [text]" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    result = run_cli("check", str(bad))
    assert result.returncode == 2 and str(bad) in result.stderr


def test_unknown_cli_option_is_a_usage_error():
    assert run_cli("serve", "--no-such-flag").returncode == 2


def test_second_daemon_on_the_same_state_dir_fails_fast(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_process(registry, tmp_path):
        second = run_cli("serve", "--config", str(registry), "--port", str(free_port()),
                         env={"MLXD_STATE_DIR": str(tmp_path / "state")})
        assert second.returncode == 2
        assert "already running" in second.stderr


def test_a_stale_lock_from_a_killed_daemon_is_taken_over(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_process(registry, tmp_path) as first:
        first.process.kill()
        first.process.wait()
    with daemon_process(registry, tmp_path) as second:
        assert httpx.get(f"{second.url}/health").status_code == 200


def test_sigterm_lets_the_stream_finish_then_exits_0(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "llama"}], server={"shutdown_grace_seconds": 30})
    with daemon_process(registry, tmp_path) as d:
        body = {"model": "a", "messages": CHAT, "max_tokens": 3000, "stream": True, "temperature": 0,
                "ignore_eos": True}
        frames: list[str] = []
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            frames.append(next(lines))
            d.process.send_signal(signal.SIGTERM)
            refused = httpx.post(f"{d.url}/v1/chat/completions", json={"model": "a", "messages": CHAT}, timeout=10)
            frames.extend(line for line in lines if line)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert frames[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in frames[-2]
        assert d.process.wait(timeout=60) == 0
        assert "draining" in d.log()


def test_api_keys_guard_v1_but_not_health(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}], server={"api_keys": ["sekrit-1"]})
    with daemon_process(registry, tmp_path) as d:
        assert httpx.get(f"{d.url}/health").status_code == 200
        missing = httpx.get(f"{d.url}/v1/models")
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        wrong = httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Invalid API key"
        assert httpx.get(f"{d.url}/v1/status", headers={"Authorization": "Bearer nope"}).status_code == 401
        good = httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer sekrit-1"})
        assert good.status_code == 200


def test_env_overrides_the_registry_and_cli_overrides_env(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}], server={"api_keys": ["from-yaml"]})
    with daemon_process(registry, tmp_path, env={"MLXD_API_KEYS": "from-env"}) as d:
        headers = {"Authorization": "Bearer from-env"}
        assert httpx.get(f"{d.url}/v1/models", headers=headers).status_code == 200
        assert httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer from-yaml"}).status_code == 401
    with daemon_process(registry, tmp_path, "--api-key", "from-cli", env={"MLXD_API_KEYS": "from-env"}) as d:
        assert httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer from-cli"}).status_code == 200


def test_json_logs_carry_request_figures_but_never_the_prompt(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    secret = "the-password-is-swordfish"
    with daemon_process(registry, tmp_path, "--log-format", "json") as d:
        r = httpx.post(f"{d.url}/v1/chat/completions",
                       json={"model": "a", "messages": [{"role": "user", "content": secret}], "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200
        wait_until(lambda: "tokens_out=3" in d.log(), timeout=10)
    records = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    assert records, d.log()
    request_logs = [r for r in records if r["logger"] == "mlxd.requests"]
    assert request_logs and "model=a status=200" in request_logs[-1]["message"]
    assert secret not in d.log()


def test_metrics_and_status_are_served(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_process(registry, tmp_path) as d:
        httpx.post(f"{d.url}/v1/chat/completions", json={"model": "a", "messages": CHAT, "max_tokens": 2}, timeout=60)
        text = httpx.get(f"{d.url}/metrics").text
        assert 'mlxd_requests_total{model="a",status="200"} 1.0' in text
        status = httpx.get(f"{d.url}/v1/status").json()
        assert status["daemon"]["blas"]["active"] == "openblas", "serve preloads Debian's OpenBLAS"


def test_concurrent_streams_all_finish_during_a_drain(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "llama", "max_concurrency": 4}])
    with daemon_process(registry, tmp_path) as d:
        results: list[str] = []
        started = threading.Barrier(4)

        def stream():
            body = {"model": "a", "messages": CHAT, "max_tokens": 1500, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as r:
                lines = r.iter_lines()
                next(lines)
                started.wait()
                results.append([l for l in lines if l][-1])

        threads = [threading.Thread(target=stream) for _ in range(3)]
        for t in threads:
            t.start()
        started.wait()
        d.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert results == ["data: [DONE]"] * 3
        assert d.process.wait(timeout=60) == 0


def test_a_second_signal_forces_a_fast_exit(tmp_path):
    # A generation far longer than the test: on a quiet machine the tiny model
    # wrote 4,000 tokens before the second signal came, and the drain had ended.
    registry = write_registry(tmp_path, [{"name": "a", "model": "llama", "max_context": 32768}],
                              server={"shutdown_grace_seconds": 300})
    with daemon_process(registry, tmp_path) as d:
        body = {"model": "a", "messages": CHAT, "max_tokens": 32000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = r.iter_lines()
            # Past the early frames (sent before the model is even loaded):
            # the generation is running and has thousands of tokens to go.
            next(line for line in lines if '"content":"' in line.replace(" ", "") and '"content":""' not in
                 line.replace(" ", ""))
            d.process.send_signal(signal.SIGTERM)
            wait_until(lambda: "draining" in d.log(), timeout=10)
            d.process.send_signal(signal.SIGTERM)
            # Well inside the 300 s grace the first signal would have granted.
            d.process.wait(timeout=30)
        assert "second signal" in d.log()


def _bit(sig: int) -> int:
    return 1 << (sig - 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sighup_while_the_daemon_starts_does_not_end_it(tmp_path):
    """A reload asked for during the start (a script that edits models.yaml,
    then signals): SIGHUP's default action ended the daemon before it served."""
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    port = free_port()
    log = open(tmp_path / "daemon.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "MLXD_STATE_DIR": str(tmp_path / "state")})
    try:
        # Python is up (its SIGINT handler), and mlxd's first lines have run:
        # SIGHUP ignored, or 0.3 s more for a daemon that never ignores it.
        wait_until(lambda: process.poll() is not None or signal_mask(process.pid, "SigCgt") & _bit(signal.SIGINT))
        try:
            wait_until(lambda: signal_mask(process.pid, "SigIgn") & _bit(signal.SIGHUP), timeout=0.3)
        except AssertionError:
            pass

        def serving() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        # ...a SIGHUP every 20 ms until it serves.
        while process.poll() is None and not serving():
            process.send_signal(signal.SIGHUP)
            threading.Event().wait(0.02)
        assert process.poll() is None, (tmp_path / "daemon.log").read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        log.close()
    assert process.returncode == 0


def test_load_and_unload_commands_talk_to_the_running_daemon(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_process(registry, tmp_path) as d:
        port = d.url.rsplit(":", 1)[1]
        env = {"MLXD_PORT": port}
        loaded = run_cli("load", "a", env=env)
        assert loaded.returncode == 0 and json.loads(loaded.stdout)["state"] == "loaded"
        assert httpx.get(f"{d.url}/v1/status").json()["models"][0]["state"] == "loaded"
        unloaded = run_cli("unload", "a", env=env)
        assert unloaded.returncode == 0 and json.loads(unloaded.stdout)["state"] == "unloaded"
        missing = run_cli("load", "nope", env=env)
        assert missing.returncode == 1 and "does not exist" in missing.stderr
    nobody = run_cli("load", "a", env={"MLXD_PORT": str(free_port())})
    assert nobody.returncode == 1 and "no mlxd is running" in nobody.stderr
