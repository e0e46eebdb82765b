"""Helpers for the prefix cache tests (imported as ``prefix_cache.cache_support``).

Real tiny models, real MLX, real files; prompts are real text because a
random model fed repeated words may stop at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mlxd.engine.loader import load_text_engine
from mlxd.engine.text import TextEngine
from mlxd.engine.types import GenerationChunk, GenerationRequest, SamplingParams
from mlxd.engine.worker import MlxWorker
from mlxd.registry.model import ModelSpec, PrefixCacheSpec

T = TypeVar("T")

# A long shared "system prompt" (a few hundred tokens) and a few user turns.
SYSTEM = (
    "You are a careful assistant for a Python code base. Answer questions about "
    "argparse, pathlib, json and logging. When you quote code, quote it exactly; "
    "when you are unsure, say which file you would read next. The project keeps "
    "its configuration in models.yaml, loads models on demand, unloads them when "
    "idle and serves an OpenAI-compatible API on a local port. "
) * 4
QUESTIONS = (
    "Read the configuration file and report the options",
    "Which function parses the command line arguments?",
    "Explain how the logging handlers are configured",
    "List the files that define the HTTP routes",
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def chat(question: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def greedy(max_tokens: int = 12, **kwargs: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        max_tokens=max_tokens,
        sampling=kwargs.pop("sampling", SamplingParams(temperature=0.0)),
        **kwargs,
    )


def spec_for(
    path: Path,
    max_bytes: int = 64 << 20,
    disk_max_bytes: int = 256 << 20,
    persist: bool = True,
    **overrides: Any,
) -> ModelSpec:
    return ModelSpec(
        name=overrides.pop("name", "tiny"),
        path=path,
        source=str(path),
        prefix_cache=PrefixCacheSpec(max_bytes=max_bytes, disk_max_bytes=disk_max_bytes, persist=persist),
        **overrides,
    )


async def open_engine(
    worker: MlxWorker, spec: ModelSpec, cache_dir: Path | None = None, prefill_chunk: int = 64
) -> TextEngine:
    return await load_text_engine(spec, worker, prefill_chunk=prefill_chunk, cache_dir=cache_dir)


async def ask(engine: TextEngine, request: GenerationRequest) -> tuple[str, GenerationChunk]:
    """The whole text and the last chunk."""
    chunks = [chunk async for chunk in engine.generate(request)]
    return "".join(c.text for c in chunks), chunks[-1]


async def unload(engine: TextEngine) -> None:
    """What the daemon does on every unload: save, then close."""
    await engine.before_unload()
    await engine.close()


def fingerprint_folder(cache_dir: Path) -> Path:
    """The one fingerprint folder under ``cache_dir/prefix``."""
    folders = [p for p in (cache_dir / "prefix").iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(folders) == 1, folders
    return folders[0]


def prefix_stats(engine: TextEngine) -> dict[str, Any]:
    return engine.stats()["prefix_cache"]


async def populate(
    worker: MlxWorker, spec: ModelSpec, cache_dir: Path, requests: list[GenerationRequest]
) -> list[str]:
    """One session: answer ``requests`` in order, then unload (which saves).
    Returns the answers."""
    engine = await open_engine(worker, spec, cache_dir)
    try:
        return [(await ask(engine, r))[0] for r in requests]
    finally:
        await unload(engine)


def manifest_of(cache_dir: Path) -> dict[str, Any]:
    import json

    return json.loads((fingerprint_folder(cache_dir) / "manifest.json").read_text())


def sessions(n: int) -> list[GenerationRequest]:
    """Prompts sharing no prefix beyond the chat template's first tokens."""
    return [greedy(messages=chat(q, system=f"Session {i}. " + SYSTEM)) for i, q in enumerate(QUESTIONS[:n])]
