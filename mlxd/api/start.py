"""From a plan to a request under way: images read, a lease held, a fresh
attempt for the leased target (``plan.for_target``: its sampling and
limits), the output request settled by its engine (``prepare``, the
generation contract of ``engine/contract.py``), and the engine heard to
accept. Each target's spec is resolved once per attempt (a failover
entry's come from its router, in the order to try them); the engine is
asked nothing but its contract. For a failover entry the targets are tried by
``mlxd.failover.attempts.first_that_starts`` in the order its strategy
picks; one that fails before any output reached the client (a
``NotForThisModel`` included) lets the next one try. A whole answer
(``answered``) reaches the client only once it is complete, so a target
that breaks off its answer lets the next one try too."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

from mlxd.api.context import DaemonContext
from mlxd.api.plan import Attempt, Plan, for_target
from mlxd.api.preemptible import Preemptible
from mlxd.engine.contract import GenerationEngine
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.errors import MlxdError, NotForThisModel, describe_exception
from mlxd.failover.attempts import first_that_starts
from mlxd.registry.kinds import CHAT
from mlxd.registry.model import ModelSpec
from mlxd.residency.shell import Lease
from mlxd.tools.formats import ToolFormat
from mlxd.tools.reasoning import ReasoningFormat

log = logging.getLogger("mlxd.requests")
T = TypeVar("T")


class Started:
    """A held lease, the attempt made on it and, on an engine that confirms
    its start, the first request already begun (its prompt fits, its
    backend took it)."""

    def __init__(self, lease: Lease, attempt: Attempt | None = None, head: _Resumed | None = None) -> None:
        self.lease = lease
        # A route that generates leases only models of a kind that does, whose
        # engines the daemon's factory checked (``daemon/engines.ContractChecked``).
        self.engine = cast(GenerationEngine, lease.engine)
        self.attempt = attempt
        self._head = head
        # Set for a bulk request residency may preempt before its first byte.
        self.preemptible: Preemptible | None = None

    @property
    def requests(self) -> list[GenerationRequest]:
        assert self.attempt is not None
        return self.attempt.requests

    @property
    def tool_format(self) -> ToolFormat | None:
        return self.attempt.formats.tool_format if self.attempt is not None else None

    @property
    def reasoning_format(self) -> ReasoningFormat | None:
        return self.attempt.formats.reasoning_format if self.attempt is not None else None

    def generate(self, index: int, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if index == 0 and self._head is not None:
            head, self._head = self._head, None
            chunks: AsyncIterator[GenerationChunk] = head
        else:
            chunks = self.engine.generate(request)
        if self.preemptible is not None:
            return self.preemptible.generate(request, chunks)
        return chunks

    async def close(self) -> None:
        """Give everything back; safe to call more than once."""
        head, self._head = self._head, None
        if head is not None:
            with contextlib.suppress(Exception):
                await head.aclose()
        self.lease.release()

    async def __aenter__(self) -> Started:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start(ctx: DaemonContext, plan: Plan) -> Started:
    """Images are read (files, remote fetches, headers) before the lease, so
    a bad image is a 400 that never loads a model or holds a slot; they are
    decoded only once the lease is held (so requests the queue refuses never
    decode anything, under the daemon-wide image memory bound), or sent on as
    data: URLs to a remote engine."""
    return await _on_targets(ctx, plan, _as_started)


async def answered(ctx: DaemonContext, plan: Plan, body: Callable[[Started], Awaitable[T]]) -> T:
    """``body(started)`` under a started request, given back after. Nothing
    of a whole answer reaches the client before ``body`` returns, so for a
    failover entry a failure inside it that lets the next target try (a
    backend that broke off its answer) does, as a failure to start would."""

    async def under(started: Started) -> T:
        async with started:
            return await body(started)

    return await _on_targets(ctx, plan, under)


async def _as_started(started: Started) -> Started:
    return started


async def _on_targets(ctx: DaemonContext, plan: Plan, then: Callable[[Started], Awaitable[T]]) -> T:
    images = plan.images if plan.images is not None and plan.images.sources else None
    if images is not None:
        await images.read()
    try:
        if plan.failover is None:
            return await then(await _start_on(ctx, plan, ctx.manager.resolve(plan.requested_name)))
        return await _fail_over(ctx, plan, then)
    finally:
        if images is not None:
            images.read_images = []  # the raw bytes are not needed any more


async def _fail_over(ctx: DaemonContext, plan: Plan, then: Callable[[Started], Awaitable[T]]) -> T:
    assert plan.failover is not None
    name = plan.failover.name
    # (The router leaves out targets a reload is removing.)
    order = [spec for spec in ctx.failover.order(plan.failover) if plan.accepts(ctx.registry.kind_of(spec))]

    async def start_on(target: ModelSpec) -> T:
        plan.spec = target  # the one tried, for the accounts
        return await then(await _start_on(ctx, plan, target))

    def fell_through(target: ModelSpec, error: MlxdError, following: ModelSpec) -> None:
        ctx.failover.fell_through(name, target.name, error)
        ctx.metrics.failover_fallthroughs.labels(name, target.name).inc()
        log.info("%s: target %s failed before any output (%s); trying %s",
                 name, target.name, describe_exception(error), following.name)

    return await first_that_starts(order, start_on, time_left=plan.remaining, fell_through=fell_through,
                                   name=plan.requested_name)


async def _start_on(ctx: DaemonContext, plan: Plan, spec: ModelSpec) -> Started:
    """Lease ``spec`` and get a fresh attempt under way there; a failure
    gives the lease straight back."""
    _check_side_by_side(plan, spec)
    # Its n choices (or prompts) run at once, each with its own KV cache.
    lease = await ctx.manager.acquire(spec.name, timeout=plan.remaining(), caller=plan.caller,
                                      slots=len(plan.requests))
    started = Started(lease)
    engine = started.engine
    try:
        attempt = for_target(plan, spec, ctx.settings.server.max_request_tokens)
        started.attempt = attempt
        for request in attempt.requests:
            request.priority = plan.caller.priority
        images = plan.images if plan.images is not None and plan.images.read_images else None
        if images is not None:
            decoded = images.data_urls() if engine.wants_image_urls else await images.decode(ctx.image_memory)
            for request in attempt.requests:  # n > 1: every choice sees them
                request.images = decoded
        attempt.formats = await engine.prepare(attempt.requests, plan.output, plan.requested_name)
        # A prompt too long for this model (ContextTooLong) may fit another target's.
        started._head = await _begun(engine, attempt.requests[0])
    except BaseException:
        await started.close()
        raise
    if plan.caller.priority == "bulk":
        # Its n choices go together; a failover entry's waits again on the
        # target it holds (docs/apps.md, Priority).
        started.preemptible = Preemptible(started, lambda held: ctx.manager.requeue(held, timeout=plan.remaining()))
    return started


def _check_side_by_side(plan: Plan, spec: ModelSpec) -> None:
    """A model that batches (max_concurrency above 1) runs a request's
    generations side by side, as many as it serves at once: more would hold
    more KV than the model is charged for. (With max_concurrency 1 they are
    interleaved under the model's one slot.) A failover entry's next target
    may serve more."""
    wanted, most = len(plan.requests), spec.max_concurrency
    if spec.holds_memory and most > 1 and wanted > most:
        param = "n" if plan.route == CHAT else "prompt"
        raise NotForThisModel(
            f"This request asks for {wanted} generations at once; `{spec.name}` runs at most {most} side by "
            f"side (max_concurrency: {most}). Ask for at most {most} ({param}), or send several requests.",
            param=param,
        )


async def _begun(engine: GenerationEngine, request: GenerationRequest) -> _Resumed:
    """``request`` begun on ``engine`` up to its first chunk (a remote
    engine's says the backend accepted it; a refusal raises here, where it
    can still be an HTTP status or let another target try)."""
    chunks = engine.generate(request)
    try:
        first = await anext(chunks)
    except BaseException:
        with contextlib.suppress(Exception):
            await chunks.aclose()
        raise
    return _Resumed(first, chunks)


class _Resumed:
    """A generation whose first chunk was taken already: it yields that
    chunk again, then the rest; closing it closes the generation, whether it
    was iterated or not."""

    def __init__(self, first: GenerationChunk, chunks: Any) -> None:
        self._first: GenerationChunk | None = first
        self._chunks = chunks

    def __aiter__(self) -> _Resumed:
        return self

    async def __anext__(self) -> GenerationChunk:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._chunks)

    async def aclose(self) -> None:
        await self._chunks.aclose()
