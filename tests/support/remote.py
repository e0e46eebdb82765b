"""Front daemons with remote entries, and real servers to put behind them:
a second `mlxd serve`, or mlx-lm's own `mlx_lm.server`. Loopback only."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from support.daemon import free_port, served_process, write_registry


def write_front(
    directory: Path,
    backends: dict[str, dict[str, Any]],
    models: list[dict[str, Any]],
) -> Path:
    """A front registry: ``backends`` as in models.yaml, ``models`` remote
    (or local, with "model" naming a tiny model as in write_registry)."""
    directory.mkdir(parents=True, exist_ok=True)
    return write_registry(directory, models, manager={"memory_budget": "1GB"}, backends=backends)


@contextlib.contextmanager
def mlx_lm_server(model_dir: Path, log_path: Path) -> Iterator[str]:
    """mlx-lm's own OpenAI server on a free loopback port; yields its /v1 URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    argv = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port)]
    with served_process(argv, log_path, f"{url}/models", timeout=120):
        yield url


def sse_events(response: httpx.Response) -> list[Any]:
    """Every ``data:`` payload of a stream, ``[DONE]`` kept as the string."""
    out: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def until_text(lines: Iterator[str]) -> None:
    """Read a stream's lines until one carries generated text."""
    assert any('"content":"' in line and '"content":""' not in line for line in lines)


def killed_mid_stream(front_url: str, body: dict[str, Any], backend: subprocess.Popen) -> list[str]:
    """Stream ``body`` through the front, SIGKILL the ``backend`` once text
    flows, and return the ``data:`` lines that came after."""
    with httpx.stream("POST", f"{front_url}/v1/chat/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        until_text(lines)
        backend.send_signal(signal.SIGKILL)
        backend.wait()
        return [line for line in lines if line.startswith("data:")]


def reload(front_url: str) -> dict[str, Any]:
    response = httpx.post(f"{front_url}/v1/admin/reload", json={}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()
