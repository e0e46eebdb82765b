"""`mlxd status` as a user runs it: a separate process that finds the daemon
from the same settings as `mlxd serve`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
import yaml
from monitoring.monitoring_support import chat
from support.daemon import daemon_in_thread, free_port, signal_mask, write_registry

pytestmark = pytest.mark.mlx

KEY = "sk-cli-test"


def mlxd(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlxd", *args], capture_output=True, text=True, env=clean_env(env), timeout=timeout
    )


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    env["COLUMNS"] = "80"  # the table must hold in a standard terminal
    return {**env, **(extra or {})}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    registry = write_registry(
        tmp,
        [
            {"name": "qwen", "model": "qwen", "aliases": ["default"], "idle_unload_seconds": 600},
            {"name": "llama", "model": "llama", "pinned": True},
        ],
    )
    with daemon_in_thread(registry, tmp, api_keys=KEY) as d:
        assert chat(d, "qwen", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        yield d


def port_of(daemon) -> str:
    return daemon.url.rsplit(":", 1)[1]


def test_table_shows_every_model_with_state_memory_leases_and_idle_countdown(daemon):
    result = mlxd("status", env={"MLXD_PORT": port_of(daemon), "MLXD_API_KEY": KEY})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("NAME "))
    rows = {line.split()[0]: line.split() for line in lines[header + 1 :] if line.strip()}
    rows = {name: cells for name, cells in rows.items() if name in ("qwen", "llama")}
    model, alias, state, memory, unit, leases, *idle, rate, loads = rows["qwen"]
    assert (model, alias, state, leases, loads) == ("qwen", "(default)", "loaded", "0/1", "1")
    assert unit == "MB" and float(rate) > 0
    assert idle in (["in", "10m"], ["in", "9m"]), idle
    assert rows["llama"][1] == "unloaded" and rows["llama"][5] == "pinned"
    assert rows["llama"][2].startswith("~")  # an estimate until it is measured
    assert "health: ok" in out and "memory [" in out
    assert "recent events" in out and "loaded qwen in" in out


def test_json_is_the_status_document(daemon):
    result = mlxd("status", "--json", "--url", daemon.url, "--api-key", KEY)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema_version"] == 1
    assert {m["name"]: m["state"] for m in doc["models"]} == {"qwen": "loaded", "llama": "unloaded"}


def test_the_address_comes_from_the_config_file_like_serve(daemon, tmp_path):
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump({"server": {"port": int(port_of(daemon))}, "models": []}))
    by_flag = mlxd("status", "--json", "--config", str(config), env={"MLXD_API_KEYS": f"{KEY},other"})
    by_env = mlxd("status", "--json", env={"MLXD_CONFIG": str(config), "MLXD_API_KEY": KEY})
    for result in (by_flag, by_env):
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["daemon"]["bind"]["port"] == int(port_of(daemon))


def test_a_url_without_its_scheme_reaches_the_daemon(daemon):
    """`--url 127.0.0.1:8080`, as one writes an address: refused before as
    "missing an 'http://' or 'https://' protocol" (and `localhost:8080` as
    "an unsupported protocol 'localhost://'")."""
    for host in ("127.0.0.1", "localhost"):
        result = mlxd("status", "--json", "--url", f"{host}:{port_of(daemon)}", "--api-key", KEY)
        assert result.returncode == 0, result.stderr
    other = mlxd("status", "--url", "ftp://127.0.0.1:21")
    assert other.returncode == 1 and "is not a URL mlxd can be reached at" in other.stderr, other.stderr


def test_no_daemon_running_is_one_plain_line_and_status_1():
    port = free_port()
    result = mlxd("status", env={"MLXD_PORT": str(port)})
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == f"mlxd: error: no mlxd is running at http://127.0.0.1:{port}"
    assert "Traceback" not in result.stderr


def test_a_missing_key_is_one_line_that_says_what_to_do(daemon):
    result = mlxd("status", env={"MLXD_PORT": port_of(daemon)})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "401" in lines[0] and "MLXD_API_KEY" in lines[0]
    assert "Traceback" not in result.stderr


def _terminal_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _signal_state(pid: int) -> str:
    return " ".join(f"{field} {signal_mask(pid, field):x}" for field in ("SigBlk", "SigIgn", "SigCgt"))


def test_watch_refreshes_until_interrupted(daemon):
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxd", "status", "--watch", "--json", "--interval", "0.3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_env({"MLXD_PORT": port_of(daemon), "MLXD_API_KEY": KEY}),
        # As a terminal's shell starts a command: Ctrl-C not ignored. A suite
        # started in the background of a shell runs with SIGINT ignored (a
        # shell's asynchronous commands do), which the watch inherited: it ran
        # on for 30 s after its SIGINT, as any such command would.
        preexec_fn=_terminal_signals,
    )
    try:
        first = json.loads(process.stdout.readline())
        assert httpx.post(f"{daemon.url}/v1/models/llama/load", json={}, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60).status_code == 200
        for _ in range(50):
            later = json.loads(process.stdout.readline())
            if {m["name"]: m["state"] for m in later["models"]}["llama"] == "loaded":
                break
        else:
            pytest.fail("the watch never showed llama loaded")
        assert later["generated_at"] > first["generated_at"]
        masks = _signal_state(process.pid)
        process.send_signal(signal.SIGINT)
        # Read on, as a terminal does: refreshes written while the load ran
        # can fill the pipe, and a watch blocked writing to it cannot exit.
        try:
            _, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the watch did not end on SIGINT; its signal state before it: {masks}")
        assert process.returncode == 0
        assert "Traceback" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
