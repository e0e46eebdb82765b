"""Helpers shared by the engine tests (imported as ``engine.engine_support``).

Tests are plain functions that drive their coroutines with ``asyncio.run``;
the worker is not tied to any event loop (each call and stream captures the
loop that awaits it), so a worker outlives the loops of single tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from mlxd.engine.types import GenerationChunk, GenerationRequest, SamplingParams
from mlxd.registry.model import ModelSpec

T = TypeVar("T")

# Real text, not repeated words: a repetitive prompt can make a random model stop at once.
CHAT = [{"role": "user", "content": "Read the configuration file and report the options"}]
PROMPT = "def parse_arguments(argv):\n    parser = argparse.ArgumentParser("


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def greedy(request_id: str = "r", max_tokens: int = 24, **kwargs: Any) -> GenerationRequest:
    if "prompt" not in kwargs and "messages" not in kwargs:
        kwargs["messages"] = CHAT
    return GenerationRequest(
        request_id=request_id,
        max_tokens=max_tokens,
        sampling=kwargs.pop("sampling", SamplingParams(temperature=0.0)),
        **kwargs,
    )


async def collect(engine: Any, request: GenerationRequest) -> list[GenerationChunk]:
    """What the generation made: its chunks after the acceptance (the empty
    chunk an engine yields first once the prompt is checked; a generation
    aborted before its turn ends without one)."""
    return after_acceptance([chunk async for chunk in engine.generate(request)])


def is_acceptance(chunk: GenerationChunk) -> bool:
    return chunk.text == "" and chunk.finish_reason is None and chunk.completion_tokens == 0


def after_acceptance(chunks: list[GenerationChunk]) -> list[GenerationChunk]:
    return chunks[1:] if chunks and is_acceptance(chunks[0]) else chunks


def text_of(chunks: list[GenerationChunk]) -> str:
    return "".join(c.text for c in chunks)


def spec_for(path: Path, name: str = "tiny", **overrides: Any) -> ModelSpec:
    return ModelSpec(name=name, path=path, source=str(path), **overrides)
