"""A bulk request's generations that residency may take their lease back
from before the first byte (docs/apps.md, Priority): while nothing of any of
them was produced (queued in its engine or in prefill), a preemption stops
them all, gives the lease back once, waits again first of its class and
starts them all over, so the client sees only latency. A request's ``n``
choices (or prompts) share one lease and go together: from the first output
chunk of any of them on, none is preempted: the lease says so before the
chunk goes anywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.residency.shell import Lease

END = object()


def is_output(chunk: GenerationChunk) -> bool:
    """Whether ``chunk`` carries anything of the answer (an engine's first,
    empty chunk only says it accepted the request)."""
    return bool(
        chunk.text or chunk.reasoning or chunk.tool_calls or chunk.logprobs
        or chunk.completion_tokens or chunk.finish_reason
    )


class Preemptible:
    """The generations under ``holder.lease`` (``lease`` and ``engine``,
    swapped for new ones on a preemption), side by side or one after the
    other. ``requeue`` gives a preempted lease back and waits for a new one."""

    def __init__(self, holder: Any, requeue: Callable[[Lease], Awaitable[Lease]]) -> None:
        self._holder = holder
        self._requeue = requeue
        # Whether any generation sent anything: then the lease is kept for good.
        self._sent = False
        # Generations iterating on the current lease; the last of them to stop
        # after a preemption gives it back (no engine row outlives its slot).
        self._live = 0
        self._given_back: Lease | None = None
        self._asked = False
        self._next: asyncio.Future[Lease] | None = None

    async def generate(self, request: GenerationRequest, chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[GenerationChunk]:
        """``chunks`` (the generation of ``request`` under the lease), as they
        come; after a preemption, the generation of ``request`` started over
        under the new lease."""
        first_pass = True
        while True:
            lease: Lease = self._holder.lease
            if not self._sent:
                lease.preemptable(True)
            self._live += 1
            try:
                async with contextlib.aclosing(chunks):  # type: ignore[type-var]
                    while True:
                        chunk = await next_unless(chunks, lease.preempted)
                        if chunk is None:
                            break  # preempted: nothing of it went anywhere
                        if chunk is END:
                            self._keep(lease)
                            return
                        if not is_output(chunk):
                            if first_pass:
                                yield chunk
                            continue
                        self._keep(lease)
                        yield chunk
                        async for rest in chunks:
                            yield rest
                        return
            finally:
                self._live -= 1
            await self._lease_again(lease)
            chunks = self._holder.engine.generate(request)
            first_pass = False

    def _keep(self, lease: Lease) -> None:
        self._sent = True
        lease.preemptable(False)

    async def _lease_again(self, lease: Lease) -> None:
        """Wait for the lease that follows ``lease``: the last generation to
        stop gives it back and waits in the queue; the others wait for it."""
        if self._given_back is not lease:
            self._given_back, self._asked = lease, False
            self._next = asyncio.get_running_loop().create_future()
        following = self._next
        assert following is not None
        if self._live > 0 or self._asked:
            await asyncio.shield(following)
            return
        self._asked = True
        try:
            new = await self._requeue(lease)
        except asyncio.CancelledError:
            following.cancel()
            raise
        except BaseException as exc:
            following.set_exception(exc)
            following.exception()  # raised here; the others see it if they wait
            raise
        self._holder.lease, self._holder.engine = new, new.engine
        following.set_result(new)


def preemptible(
    holder: Any,
    request: GenerationRequest,
    chunks: AsyncIterator[GenerationChunk],
    requeue: Callable[[Lease], Awaitable[Lease]],
) -> AsyncIterator[GenerationChunk]:
    """One generation alone under ``holder.lease``, as ``Preemptible`` runs it."""
    return Preemptible(holder, requeue).generate(request, chunks)


async def next_unless(chunks: AsyncIterator[Any], stop: asyncio.Event) -> Any:
    """The next chunk (``END`` after the last), or None once ``stop`` is set
    first; the step it cut is cancelled, which ends the generation (an
    audio stream's too, cancelled by id)."""
    if stop.is_set():
        return None
    step = asyncio.ensure_future(anext(chunks, END))
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
