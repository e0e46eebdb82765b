"""A real daemon for hot-reload tests: tiny models served in a thread, with
the reloader wired as ``mlxd serve`` wires it, and every engine load counted."""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from support.daemon import Daemon, free_port, wait_until, write_registry

from mlxd.daemon.build import build_daemon
from mlxd.daemon.engines import EngineFactory
from mlxd.daemon.reload import Reloader
from mlxd.engine.worker import MlxWorker
from mlxd.registry.loader import load_registry
from mlxd.settings import DaemonSettings

CHAT = [{"role": "user", "content": "Read the configuration file and report the errors"}]


class CountingFactory:
    """The real engine factory, remembering which model loaded from where."""

    def __init__(self, worker: MlxWorker) -> None:
        self._real = EngineFactory(worker)
        self.loads: list[tuple[str, str]] = []

    async def __call__(self, spec: Any, registry: Any) -> Any:
        self.loads.append((spec.name, spec.path.name))
        return await self._real(spec, registry)

    def count(self, model: str) -> int:
        return collections.Counter(name for name, _ in self.loads)[model]


@dataclass
class ReloadingDaemon(Daemon):
    registry: Path = field(default_factory=Path)
    factory: CountingFactory | None = None
    reloader: Reloader | None = None

    def config(self) -> dict[str, Any]:
        return self.status()["config"]

    def wait_generation(self, generation: int, timeout: float = 30.0) -> dict[str, Any]:
        return wait_until(lambda: (c := self.config())["generation"] >= generation and c, timeout=timeout)

    def wait_error(self, timeout: float = 30.0) -> dict[str, Any]:
        return wait_until(lambda: self.config()["error"], timeout=timeout)

    def chat(self, model: str, max_tokens: int = 8, **kw: Any) -> httpx.Response:
        body = {"model": model, "messages": CHAT, "max_tokens": max_tokens, "temperature": 0, **kw}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)

    def reload(self, **kw: Any) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/admin/reload", json={}, timeout=60, **kw)

    def reload_events(self) -> list[dict[str, Any]]:
        return [e for e in self.status()["events"] if e["kind"] == "reload"]


def registry_doc(
    directory: Path,
    models: list[dict[str, Any]],
    manager: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
) -> str:
    """The text support.daemon.write_registry would write for ``directory``,
    without touching the live file (each test picks how it is saved)."""
    stage = directory / ".stage"
    stage.mkdir(exist_ok=True)
    manager = {"cache_dir": str(directory / "cache"), **(manager or {})}
    return write_registry(stage, models, manager=manager, server=server).read_text()


def replace_atomically(path: Path, text: str) -> None:
    """How most editors and config tools save: write aside, rename over."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    aside.write_text(text)
    os.replace(aside, path)


@contextlib.contextmanager
def reloading_daemon(
    registry: Path, tmp_path: Path, *, watch: bool = True, debounce_s: float = 0.2, **settings: Any
) -> Iterator[ReloadingDaemon]:
    port = free_port()
    s = DaemonSettings(config=registry, port=port, state_dir=tmp_path / "state", watch_config=watch, **settings)
    initial = load_registry(registry)
    worker = MlxWorker()
    factory = CountingFactory(worker)
    built = build_daemon(s, initial, worker=worker, engines=factory, reload_debounce_s=debounce_s)
    ctx, server, reloader = built.ctx, built.server, built.reloader
    thread = threading.Thread(target=server.run, name="test-reload-daemon", daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout=30)
    try:
        yield ReloadingDaemon(
            url=f"http://127.0.0.1:{port}", ctx=ctx, registry=registry, factory=factory, reloader=reloader
        )
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "daemon thread did not stop"
