"""A kind of model that is not in mlxd: an engine that echoes the last
message back. The whole of it is this module and one row of the kinds
table (``ECHO``); tests/kinds proves the daemon serves, leases, budgets and
shows it with no other edit. The engine implements the generation contract
(``mlxd.engine.contract.GenerationEngine``) and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import yaml

from mlxd.daemon.build import build_daemon
from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.registry.kinds import CHAT, KINDS, ModelKind
from mlxd.registry.loader import load_registry
from mlxd.registry.model import ModelSpec
from mlxd.settings import DaemonSettings
from mlxd.tools.output_request import OutputRequest
from support.daemon import Daemon, free_port, wait_until

ECHO = ModelKind(name="echo", engine="support.echo_engine:load_echo_engine", routes=frozenset({CHAT}))
WITH_ECHO = {**KINDS, ECHO.name: ECHO}


class EchoEngine(GenerationEngine):
    kind = "echo"
    # It cannot measure itself: the registry's estimate is its charge.
    measured_bytes: int | None = None
    # One answer at a time; it takes no images (its row says so).
    batching = False
    wants_image_urls = False

    def __init__(self, spec: ModelSpec) -> None:
        self.name = spec.name
        self.answered = 0
        self.closed = False
        # A message starting "hold" waits here before it is answered, so a
        # test can look at the daemon while the lease is held.
        self.gate = threading.Event()

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        # Its row has no grammars: a request asking for tools or a format was refused before the lease.
        return AnswerFormats()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk(text="")  # accepted
        text = _last_text(request.messages or [])
        if text.startswith("hold"):
            await asyncio.to_thread(self.gate.wait, 30)
        words = len(text.split())
        self.answered += 1
        yield GenerationChunk(text=text, finish_reason="stop", prompt_tokens=words, completion_tokens=words)

    async def abort_all(self, reason: str) -> int:
        return 0

    async def before_unload(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True

    async def clear_prefix_cache(self) -> bool:
        return False

    def stats(self) -> dict[str, Any]:
        return {"kind": self.kind, "answered": self.answered}


def _last_text(messages: list[dict[str, Any]]) -> str:
    content = messages[-1].get("content", "") if messages else ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


async def load_echo_engine(spec: ModelSpec, worker: Any, *, cache_dir: Path) -> EchoEngine:
    return EchoEngine(spec)


def echo_folder(path: Path) -> Path:
    """What a model folder needs for the registry: a config and weights (none)."""
    path.mkdir()
    (path / "config.json").write_text("{}")
    header = json.dumps({"__metadata__": {}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@contextlib.contextmanager
def echo_daemon(tmp_path: Path, server: dict[str, Any] | None = None,
                apps: list[dict[str, Any]] | None = None) -> Iterator[Daemon]:
    """Two echo models of 1.2 GB each, under a 2 GB budget: only one fits."""
    folder = echo_folder(tmp_path / "echo")
    doc = {
        "manager": {"memory_budget": "2GB", "cache_dir": str(tmp_path / "cache")},
        **({"server": server} if server else {}),
        **({"apps": apps} if apps is not None else {}),
        "models": [
            {"name": name, "path": str(folder), "kind": "echo", "estimated_memory_gb": 1.2}
            for name in ("echo-a", "echo-b")
        ],
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    settings = DaemonSettings(config=path, port=port, state_dir=tmp_path / "state", watch_config=False)
    built = build_daemon(settings, load_registry(path, kinds=WITH_ECHO))
    thread = threading.Thread(target=built.server.run, name="echo-daemon", daemon=True)
    thread.start()
    wait_until(lambda: built.server.started, timeout=30)
    try:
        yield Daemon(url=f"http://127.0.0.1:{port}", ctx=built.ctx)
    finally:
        built.server.should_exit = True
        thread.join(timeout=60)
