"""Real daemons for end-to-end tests: tiny real models, a models.yaml written
per test, and uvicorn serving on a free loopback port, either in a thread of
the test process or as a separate `mlxd serve` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from mlxd.factory import ModelRecipe, build_model

TINY = {
    "qwen": ModelRecipe("qwen2", "tiny", seed=0),
    "llama": ModelRecipe("llama", "tiny", seed=1),
    "qwen-b": ModelRecipe("qwen2", "tiny", seed=2),
}


def tiny_model(kind: str = "qwen") -> Path:
    return build_model(TINY[kind])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_registry(
    directory: Path,
    models: list[dict[str, Any]],
    manager: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    backends: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """models: entries like {"name": "a", "model": "qwen", ...}; "model" picks
    a tiny model from TINY and becomes the entry's path. ``backends`` as in
    models.yaml."""
    entries = []
    for m in models:
        entry = dict(m)
        kind = entry.pop("model", None)
        if kind is not None:
            entry["path"] = str(tiny_model(kind))
        entries.append(entry)
    doc = {
        "manager": {"memory_budget": "2GB", "cache_dir": str(directory / "cache"), **(manager or {})},
        **({"backends": backends} if backends is not None else {}),
        "models": entries,
    }
    if server:
        doc["server"] = server
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class Daemon:
    url: str
    ctx: Any = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def status(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/v1/status", timeout=10).json()

    def model(self, name: str) -> dict[str, Any]:
        return next(m for m in self.status()["models"] if m["name"] == name)

    def log(self, until: Any = None, timeout: float = 10.0) -> str:
        """The daemon's log so far. The daemon writes its log from a thread
        of its own (mlxd/daemon/logs.py), so a line about a request may land
        just after its answer: ``until`` (text, a compiled pattern, or a
        test of the whole log) waits up to ``timeout`` s for it first, then
        until the log has not grown for a moment (the lines queued behind)."""
        if until is None:
            return self.log_path.read_text() if self.log_path else ""
        if isinstance(until, str):
            # Not ``until.__contains__``: that asks whether the log is in the
            # text, so it waited out every timeout (or, on an empty log, none).
            def found(text: str) -> bool:
                return until in text
        elif isinstance(until, re.Pattern):
            found = until.search
        else:
            found = until
        deadline = time.monotonic() + timeout
        text = self.log()
        while not found(text) and time.monotonic() < deadline:
            time.sleep(0.02)
            text = self.log()
        while True:
            time.sleep(0.1)
            settled = self.log()
            if settled == text:
                return text
            text = settled


def signal_mask(pid: int, field: str) -> int:
    """SigBlk, SigIgn or SigCgt of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return int(next(line for line in status if line.startswith(f"{field}:")).split()[1], 16)
    except (OSError, StopIteration):
        return 0


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


@contextlib.contextmanager
def daemon_in_thread(registry: Path, tmp_path: Path, telemetry: Any = None, **settings: Any) -> Iterator[Daemon]:
    from mlxd.daemon.build import build_daemon
    from mlxd.registry.loader import load_registry
    from mlxd.settings import DaemonSettings

    port = free_port()
    s = DaemonSettings(config=registry, port=port, state_dir=tmp_path / "state", watch_config=False, **settings)
    built = build_daemon(s, load_registry(registry), telemetry=telemetry)
    server, ctx = built.server, built.ctx
    thread = threading.Thread(target=server.run, name="test-daemon", daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=30)
    try:
        yield Daemon(url=f"http://127.0.0.1:{port}", ctx=ctx)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "daemon thread did not stop"


@contextlib.contextmanager
def served_process(
    argv: list[str], log_path: Path, ready_url: str, *, env: dict[str, str] | None = None, timeout: float = 60
) -> Iterator[subprocess.Popen]:
    """A server process (``mlxd serve``, ``mlx_lm.server``...) with its output
    in ``log_path``, yielded once ``ready_url`` answers 200; stopped with
    SIGTERM (a kill after a minute) however the test ends. A process that
    exits before it is ready fails the test with its log."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"{' '.join(argv[2:4])} exited early ({process.returncode}):\n{log_path.read_text()}")
        try:
            return httpx.get(ready_url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=timeout, interval=0.1)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def daemon_process(
    registry: Path | None, tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    """``registry`` None: no --config, so mlxd picks its registry itself."""
    port = free_port()
    log_path = tmp_path / f"daemon-{port}.log"
    full_env = {**os.environ, "MLXD_STATE_DIR": str(tmp_path / "state"), **(env or {})}
    config = ["--config", str(registry)] if registry is not None else []
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "mlxd", "serve", *config, "--port", str(port), *args]
    with served_process(argv, log_path, f"{url}/health", env=full_env) as process:
        yield Daemon(url=url, process=process, log_path=log_path)


def holding_the_worker(daemon: Daemon, pool: Any, worker: Any = None) -> tuple[Any, threading.Event]:
    """The daemon's shared MLX worker (or ``worker``: an encoder's pass
    thread) busy with a call (as during another model's load) until the
    returned event is set; ``pool`` (a thread pool) runs it, and the future
    it gives ends once the call has. Work leased meanwhile waits on the
    worker, having sent nothing."""
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(60)

    busy = pool.submit(asyncio.run, (worker or daemon.ctx.worker).call(hold))
    assert holding.wait(30), "the worker runs the call that holds it"
    return busy, gate
