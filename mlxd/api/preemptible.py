"""A bulk request's generation that residency may take its lease back from
before its first byte (docs/apps.md, Priority): while nothing of it was
produced (queued in its engine or in prefill), a preemption stops it, gives
the lease back, waits again first of its class and starts it over, so its
client sees only latency. From its first output chunk on it is never
preempted: the lease says so before the chunk goes anywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.residency.shell import Lease

_END = object()


def is_output(chunk: GenerationChunk) -> bool:
    """Whether ``chunk`` carries anything of the answer (an engine's first,
    empty chunk only says it accepted the request)."""
    return bool(
        chunk.text or chunk.reasoning or chunk.tool_calls or chunk.logprobs
        or chunk.completion_tokens or chunk.finish_reason
    )


async def preemptible(
    holder: Any,
    request: GenerationRequest,
    chunks: AsyncIterator[GenerationChunk],
    requeue: Callable[[Lease], Awaitable[Lease]],
) -> AsyncIterator[GenerationChunk]:
    """``chunks`` (the generation of ``request`` under ``holder.lease``), as
    they come; on a preemption before the first output, ``requeue`` gets a
    new lease, set on ``holder`` (``lease`` and ``engine``), and the
    generation starts over there."""
    first_pass = True
    while True:
        lease: Lease = holder.lease
        lease.preemptable(True)
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            while True:
                chunk = await _next_unless(chunks, lease.preempted)
                if chunk is None:
                    break  # preempted: nothing of it went anywhere
                if chunk is _END:
                    lease.preemptable(False)
                    return
                if not is_output(chunk):
                    if first_pass:
                        yield chunk
                    continue
                lease.preemptable(False)
                yield chunk
                async for rest in chunks:
                    yield rest
                return
        holder.lease = await requeue(lease)
        holder.engine = holder.lease.engine
        chunks = holder.engine.generate(request)
        first_pass = False


async def _next_unless(chunks: AsyncIterator[GenerationChunk], stop: asyncio.Event) -> Any:
    """The next chunk (``_END`` after the last), or None once ``stop`` is set
    first; the step it cut is cancelled, which ends the generation."""
    if stop.is_set():
        return None
    step = asyncio.ensure_future(anext(chunks, _END))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({step, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await step
    if step.cancelled() or stop.is_set():
        return None
    return step.result()
