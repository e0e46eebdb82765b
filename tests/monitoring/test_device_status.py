"""The device, its memory and what MLX has in use, in /health, /v1/status and
`mlxd status`; the budget's percentage is of that memory."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import psutil
import pytest
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("device")
    registry = write_registry(tmp, [{"name": "qwen", "model": "qwen"}], manager={"memory_budget": "50%"})
    with daemon_in_thread(registry, tmp) as d:
        yield d


def test_status_names_the_device_and_the_budget_is_a_share_of_its_memory(daemon):
    import mlx.core as mx

    doc = daemon.status()
    device = doc["daemon"]["device"]
    if mx.default_device().type == mx.DeviceType.cpu:
        assert device["kind"] == "cpu" and device["memory_source"] == "system RAM"
        assert device["memory_bytes"] == psutil.virtual_memory().total
    assert device["name"]
    memory = doc["memory"]
    assert memory["device_total_bytes"] == device["memory_bytes"]
    assert memory["budget_source"] == device["memory_source"]
    assert abs(memory["budget_bytes"] - device["memory_bytes"] // 2) <= 1
    assert memory["mlx"]["active_bytes"] is not None


def test_health_says_the_device_and_what_mlx_holds(daemon):
    assert httpx.post(f"{daemon.url}/v1/models/qwen/load", json={}, timeout=120).status_code == 200
    health = httpx.get(f"{daemon.url}/health").json()
    assert health["device"]["kind"] == daemon.status()["daemon"]["device"]["kind"]
    assert health["device"]["memory_bytes"] > 0
    # A loaded model's weights are in MLX's active memory (the tiny one: ~2 MB).
    assert health["mlx_active_bytes"] > 1_000_000


def test_mlxd_status_prints_the_device_line(daemon):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    done = subprocess.run([sys.executable, "-m", "mlxd", "status", "--url", daemon.url],
                          capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    device = daemon.status()["daemon"]["device"]
    line = next(l for l in done.stdout.splitlines() if l.startswith("device: "))
    assert line.startswith(f"device: {device['kind']} ") and "MLX active" in line
