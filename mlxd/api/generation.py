"""From a plan to engine output, for every API surface: hold a lease, race
the work against the client's disconnect and the request's deadline, turn
engine chunks into output events, and either collect them into an Answer or
stream them through the surface's framer. Accounts (metrics, token counts,
the request log) are kept here, once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxd.api.accounting import record_request
from mlxd.api.auth import caller_of
from mlxd.api.capture import Captured
from mlxd.api.context import DaemonContext
from mlxd.api.inflight import InFlightRequest
from mlxd.api.inbox import StreamInbox
from mlxd.api.events import ChoiceEvents, Finish, Logprobs, OutputEvent, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from mlxd.api.plan import Plan
from mlxd.api.refusals import ACCOUNTED
from mlxd.api.request_ids import request_id_of
from mlxd.api.start import Started, answered, start
from mlxd.engine.contract import GenerationEngine
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.monitoring.metrics import OutputMeter
from mlxd.errors import (
    ClientDisconnected,
    MlxdError,
    ModelPreempted,
    RequestCancelled,
    RequestTimeout,
    describe_exception,
)

log = logging.getLogger("mlxd.requests")
T = TypeVar("T")


def _preempted(plan: Plan, retry_after: float | None = None) -> ModelPreempted:
    return ModelPreempted(
        f"Generation on `{plan.requested_name}` was interrupted: the model was preempted "
        "or the daemon is shutting down",
        retry_after=retry_after,
    )


# --- racing work against disconnects and deadlines ---------------------------


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read already, so
    the next ASGI message can only be the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def guarded(
    request: Request, work: Awaitable[T], timeout: float, cancelled: asyncio.Event | None = None
) -> T:
    """Run ``work`` until it finishes, the client disconnects (499), the
    deadline passes (504) or the request is cancelled by id (499, with a
    body). Either way the work is cancelled and awaited, so whatever it held
    (a lease, a place in the queue) has been given back when this returns."""
    task = asyncio.ensure_future(work)
    watchers = {asyncio.ensure_future(_disconnected(request))}
    stopper = asyncio.ensure_future(cancelled.wait()) if cancelled is not None else None
    if stopper is not None:
        watchers.add(stopper)
    try:
        done, _ = await asyncio.wait({task, *watchers}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for watcher in watchers:
            watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if stopper is not None and stopper in done:
        raise RequestCancelled("The request was cancelled (POST /v1/requests/{id}/cancel)")
    if done:
        raise ClientDisconnected("client disconnected")
    raise RequestTimeout(f"Request timed out after {timeout:.1f} seconds")


def _choice_events(plan: Plan, started: Started) -> ChoiceEvents:
    tools = started.requests[0].tools_to_parse() if started.requests else None
    return ChoiceEvents(
        started.tool_format, tools, started.reasoning_format,
        hide_reasoning=plan.reasoning.exclude, one_call=plan.output.parallel_tool_calls is False,
        call_id_prefix=plan.call_id_prefix,
    )


# --- one answer ---------------------------------------------------------------


@dataclass
class CalledTool:
    id: str = ""
    name: str = ""
    # JSON text, as the model wrote it.
    arguments: str = ""


@dataclass
class Choice:
    text: str = ""
    finish_reason: str = "stop"
    # The stop string that ended the choice, if one did.
    stop_sequence: str | None = None
    tool_calls: list[CalledTool] = field(default_factory=list)
    # mlxd.engine.logprobs.TokenLogprob per token, when the request asked.
    logprobs: list[Any] = field(default_factory=list)
    # What the model reasoned before its answer (a thinking model's).
    reasoning: str = ""


@dataclass
class Answer:
    """Every event of a finished request, collected per choice."""

    choices: list[Choice]
    usage: Usage = field(default_factory=Usage)

    def add(self, event: OutputEvent) -> None:
        while len(self.choices) <= event.choice:
            self.choices.append(Choice())
        choice = self.choices[event.choice]
        if isinstance(event, TextDelta):
            choice.text += event.text
        elif isinstance(event, ReasoningDelta):
            choice.reasoning += event.text
        elif isinstance(event, ToolCallDelta):
            while len(choice.tool_calls) <= event.index:
                choice.tool_calls.append(CalledTool())
            call = choice.tool_calls[event.index]
            call.id = event.id or call.id
            call.name = event.name or call.name
            call.arguments += event.arguments
        elif isinstance(event, Logprobs):
            choice.logprobs.extend(event.entries)
        elif isinstance(event, Finish):
            choice.finish_reason = event.reason
            choice.stop_sequence = event.stop_sequence
            self.usage = self.usage + event.usage


def _together(engine: GenerationEngine, requests: list[GenerationRequest]) -> bool:
    """Whether a plan's requests (n > 1, a list of prompts) decode side by
    side: only in a continuous batch, which bounds the rows itself; the single
    path runs them one after the other within its one slot."""
    return len(requests) > 1 and engine.batching


async def _run_each(
    engine: GenerationEngine, requests: list[GenerationRequest], one: Callable[[int, GenerationRequest], Awaitable[None]]
) -> None:
    """``one(index, request)`` for every request, side by side when the
    engine batches; the first failure is raised as itself."""
    if not _together(engine, requests):
        for index, request in enumerate(requests):
            await one(index, request)
        return
    try:
        async with asyncio.TaskGroup() as group:
            for index, request in enumerate(requests):
                group.create_task(one(index, request))
    except BaseExceptionGroup as group_failure:
        failure: BaseException = group_failure
        while isinstance(failure, BaseExceptionGroup) and failure.exceptions:
            failure = failure.exceptions[0]
        raise failure from None


class _Spent:
    """The tokens of the answer being collected, the unfinished choices'
    running counts included (their chunks carry them): a whole answer cut
    short (a deadline, a disconnect, a preemption) is logged with what it
    really cost."""

    def __init__(self) -> None:
        self.answer = Answer(choices=[])
        self._partial: dict[int, tuple[int, int]] = {}
        # A lease was held and generation began (else there is nothing to cut).
        self.begun = False

    def restart(self) -> Answer:
        """A fresh answer for a fresh attempt (a failover's next target)."""
        self.answer, self._partial, self.begun = Answer(choices=[]), {}, True
        return self.answer

    def cut(self, choices: int) -> Answer:
        """The answer so far, as a cancelled stream ends: every unfinished
        choice stops where it is, and the usage counts what it cost."""
        answer = self.answer
        while len(answer.choices) < choices:
            answer.choices.append(Choice())
        prompt, completion = self.totals()
        answer.usage = replace(answer.usage, prompt_tokens=prompt, completion_tokens=completion)
        self._partial = {}
        return answer

    def chunk(self, index: int, chunk: GenerationChunk) -> None:
        self._partial[index] = (chunk.prompt_tokens, chunk.completion_tokens)

    def finished(self, index: int) -> None:
        self._partial.pop(index, None)

    def totals(self) -> tuple[int, int]:
        usage = self.answer.usage
        return (usage.prompt_tokens + sum(p for p, _ in self._partial.values()),
                usage.completion_tokens + sum(c for _, c in self._partial.values()))


async def _generate_all(plan: Plan, started: Started, meter: OutputMeter, spent: _Spent) -> Answer:
    answer = spent.restart()
    events = _choice_events(plan, started)

    def add(index: int, chunk: GenerationChunk) -> None:
        for event in events.of(index, chunk):
            answer.add(event)
            if isinstance(event, Finish):
                spent.finished(index)

    async def one(index: int, request: GenerationRequest) -> None:
        last = GenerationChunk(text="")
        async with contextlib.aclosing(started.generate(index, request)) as chunks:
            async for chunk in chunks:
                meter.chunk(request.request_id, chunk)
                spent.chunk(index, chunk)
                last = chunk
                if chunk.finish_reason != "abort":
                    add(index, chunk)
        if last.finish_reason == "abort":
            raise _preempted(plan, retry_after=5)
        if not last.finish_reason:
            add(index, GenerationChunk("", "stop", last.prompt_tokens, last.completion_tokens, last.cached_tokens))

    await _run_each(started.engine, started.requests, one)
    return answer


async def complete(ctx: DaemonContext, plan: Plan, request: Request, ticket: InFlightRequest) -> Answer:
    meter = ticket.meter = ctx.metrics.meter(plan.name, plan.started)
    spent = _Spent()

    async def work() -> Answer:
        return await answered(ctx, plan, lambda started: _generate_all(plan, started, meter, spent))

    try:
        answer = await guarded(request, work(), plan.remaining(), ticket.cancelled)
        finish = answer.choices[0].finish_reason if answer.choices else None
    except RequestCancelled as exc:
        if not spent.begun:  # still queued: there is no answer to give
            record_request(ctx, exc.status_code, plan, 0, 0, ticket=ticket, meter=meter, finish="cancelled",
                           error=exc.message)
            raise
        # Cancelled by id while generating: the answer so far, as a
        # cancelled stream gives it (its text and its usage).
        answer, finish = spent.cut(len(plan.requests)), "cancelled"
    except MlxdError as exc:
        record_request(
            ctx, exc.status_code, plan, *spent.totals(), ticket=ticket, meter=meter, error=exc.message
        )
        raise
    except Exception:
        # A fault of ours: counted and kept like any failure (a stream's is,
        # by its state); the app's error handler answers 500 and logs the traceback.
        record_request(ctx, 500, plan, *spent.totals(), ticket=ticket, meter=meter, error="internal error")
        raise
    usage = answer.usage
    if ticket.capture is not None and answer.choices:
        ticket.capture.add_output(answer.choices[0].text)
    record_request(
        ctx, 200, plan, usage.prompt_tokens, usage.completion_tokens, ticket=ticket, meter=meter,
        cached=usage.cached_tokens, finish=finish,
    )
    return answer


# --- streaming ---------------------------------------------------------------
# Server-sent events are framed on Starlette's StreamingResponse rather than
# with sse-starlette: the lease must be given back even when the body is never
# iterated, and heartbeats must flow while the engine is silent without
# counting as progress. What the frames say is the surface's framer's job.


class Framer(Protocol):
    """How one surface writes its stream. Each method returns the text to
    send (possibly several frames, possibly empty)."""

    heartbeat: str
    # True: wait EARLY_WAIT_SECONDS for the lease (what fails at once, such
    # as a full queue, is still a real status code), then answer 200, send
    # opening() and keep waiting with heartbeats flowing, so a client never
    # sits through a queue or a load without a byte; a failure after that
    # travels as an error frame. False: acquire first, so a 503/504 is a
    # real status code.
    early: bool

    def opening(self) -> str: ...
    def event(self, event: OutputEvent) -> str: ...
    def error(self, exc: BaseException) -> str: ...
    def closing(self, usage: Usage | None) -> str:
        """The end of the stream; ``usage`` is None after an error frame."""
        ...


_END = object()
# Put into a stream's queue when it has been quiet for a heartbeat interval.
_TICK = object()
# Put into it when the request is cancelled by id.
_CANCEL = object()
# Put into it when the request's own ``timeout`` is over.
_DEADLINE = object()


class ClosingStreamingResponse(StreamingResponse):
    """A stream whose body (and ``also``: what the body reads from, a
    lease's holder) is closed however the response ends: a client that is
    gone before the first byte leaves the body never iterated, and one that
    stopped reading leaves it suspended between two chunks, where cancelling
    the send does not reach it; what it held waited for the garbage collector."""

    def __init__(self, content: AsyncIterator[Any], *also: AsyncIterator[Any], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._closed_last = (content, *also)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for stream in self._closed_last:
                with contextlib.suppress(Exception):
                    await stream.aclose()  # type: ignore[attr-defined]


class LeasedStreamingResponse(ClosingStreamingResponse):
    """A stream that gives its lease back however it ends, even when the
    client is gone before the first byte and the body is never iterated."""

    def __init__(
        self, content: AsyncIterator[str], started: Started | None, *,
        pending: asyncio.Future[Started] | None = None, done: Callable[[], None] = lambda: None, **kw: Any,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", **kw)
        self._started = started
        # An early stream's lease, still being waited for.
        self._pending = pending
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._started is not None:
                await self._started.close()
            if self._pending is not None:
                await _abandon(self._pending)
            self._done()


async def open_stream(
    ctx: DaemonContext, plan: Plan, request: Request, framer: Framer, ticket: InFlightRequest
) -> LeasedStreamingResponse:
    """Start before answering (a remote engine's backend accepting
    included), so a 404/429/503/504 is a real status code; an ``early``
    framer waits only a moment for that, then answers 200 and keeps waiting
    inside the stream, heartbeats flowing. Once the 200 is sent, errors
    travel in the stream."""
    acquiring = asyncio.ensure_future(start(ctx, plan))
    # Not early: the deadline (guarded's) ends the wait, with a 504.
    wait = EARLY_WAIT_SECONDS if getattr(framer, "early", False) else plan.remaining() + 1
    try:
        started = await guarded(request, _first_of(acquiring, wait), plan.remaining(), ticket.cancelled)
    except MlxdError as exc:
        finish = "cancelled" if isinstance(exc, RequestCancelled) else None
        record_request(ctx, exc.status_code, plan, ticket=ticket, finish=finish, error=exc.message)
        raise
    pending = None if started is not None else acquiring
    frames = _frames(ctx, plan, started, framer, pending, ticket)
    return LeasedStreamingResponse(
        frames, started, pending=pending, done=lambda: ctx.inflight.remove(ticket),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# How long an early stream waits for its lease before it answers 200: long
# enough that a full queue or an unknown failure is a real status code, short
# enough that a queued client sees its first byte at once.
EARLY_WAIT_SECONDS = 0.5


async def _first_of(acquiring: asyncio.Future[Started], seconds: float) -> Started | None:
    """The lease if ``acquiring`` settles within ``seconds`` (raising what it
    raised), else None with the wait still running. Cancelled (disconnect,
    deadline), it cancels the wait too."""
    try:
        done, _ = await asyncio.wait({acquiring}, timeout=max(0.0, seconds))
    except asyncio.CancelledError:
        await _abandon(acquiring)
        raise
    return acquiring.result() if done else None


async def _abandon(acquiring: asyncio.Future[Started]) -> None:
    """Stop waiting for a lease; one granted meanwhile is given back."""
    if not acquiring.done():
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await acquiring
    elif not acquiring.cancelled() and acquiring.exception() is None:
        await acquiring.result().close()


async def _pump(started: Started, requests: list[GenerationRequest], queue: StreamInbox) -> None:
    async def one(index: int, request: GenerationRequest) -> None:
        async with contextlib.aclosing(started.generate(index, request)) as chunks:
            async for chunk in chunks:
                queue.put_nowait((index, chunk))

    try:
        await _run_each(started.engine, requests, one)
        queue.put_nowait(_END)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        queue.put_nowait(exc)
    # The engine is done: the lease goes back now, not once the client has
    # read the last frame. A client that stops reading blocks the frame
    # writer in its send, and held the model's slot for as long as it kept
    # the connection open, every other request of the model queued behind it.
    await started.close()


class _StreamState:
    """Turns engine output into frames and keeps the stream's accounts."""

    def __init__(self, ctx: DaemonContext, plan: Plan, framer: Framer, capture: Captured | None = None,
                 request_id: str = "") -> None:
        self.plan = plan
        self.capture = capture
        # For its failure's log line: the request log line and activity row carry the same id.
        self.request_id = request_id
        self.framer = framer
        self.meter = ctx.metrics.meter(plan.name, plan.started)
        # Made at the first chunk: the tool-call format is known once leased.
        self.events: ChoiceEvents | None = None
        self.usage = Usage()
        # Running counts of the generation in progress (its chunks carry
        # them): a stream that ends early is logged with what it really cost.
        self._partial = (0, 0)
        self.status = 200
        self.finished: set[int] = set()
        self.cancelled = False
        # For the activity log: the last choice's finish, and what failed.
        self.finish: str | None = None
        self.error: str | None = None

    def totals(self) -> tuple[int, int]:
        """Prompt and completion tokens so far, the unfinished prompt included."""
        return self.usage.prompt_tokens + self._partial[0], self.usage.completion_tokens + self._partial[1]

    def handle(self, item: Any) -> tuple[list[str], bool]:
        """Frames for one queue item, and whether the stream is over."""
        if item is _END:
            return [], True
        if item is _CANCEL:
            return self.cancel(), True
        if item is _DEADLINE:
            late = RequestTimeout(f"Request timed out after {self.plan.timeout:.1f} seconds")
            self.fail(late)
            return [self.framer.error(late)], True
        if isinstance(item, BaseException):
            self.fail(item)
            if isinstance(item, MlxdError):  # a backend that failed, a preemption: expected, and typed
                log.warning("stream on %s failed (request_id=%s): %s", self.plan.name, self.request_id,
                            describe_exception(item))
            else:
                log.error("stream on %s failed (request_id=%s): %s", self.plan.name, self.request_id,
                          describe_exception(item), exc_info=item)
            return [self.framer.error(item)], True
        index, chunk = item
        self.meter.chunk(index, chunk)
        self._partial = (chunk.prompt_tokens, chunk.completion_tokens)
        if chunk.finish_reason == "abort":
            preempted = _preempted(self.plan)
            self.fail(preempted)
            return [self.framer.error(preempted)], True
        assert self.events is not None  # set once the attempt started
        out = []
        for event in self.events.of(index, chunk):
            if isinstance(event, Finish):
                self._partial = (0, 0)
                self.usage = self.usage + event.usage
                self.finished.add(event.choice)
                self.finish = event.reason
            elif self.capture is not None and isinstance(event, TextDelta) and event.choice == 0:
                self.capture.add_output(event.text)
            out.append(self.framer.event(event))
        return out, False

    def fail(self, exc: BaseException) -> None:
        self.status = exc.status_code if isinstance(exc, MlxdError) else 500
        # What a client may read; an unexpected failure's text stays in the server log.
        self.error = exc.message if isinstance(exc, MlxdError) else "internal error"

    def cancel(self) -> list[str]:
        """Cancelled by id: every unfinished choice ends as if it had
        stopped, with the tokens it cost so far; the stream then closes
        cleanly. (The engine stops at its next step once the pump goes.)"""
        self.cancelled = True
        self.finish = "cancelled"
        prompt, completion = self._partial
        out = []
        for choice in range(max(1, len(self.plan.requests))):
            if choice not in self.finished:
                usage = Usage(prompt, completion)
                prompt = completion = 0  # the running counts are one generation's
                self.finished.add(choice)
                self.usage = self.usage + usage
                out.append(self.framer.event(Finish(choice, "stop", usage)))
        self._partial = (0, 0)
        return out


async def _heartbeats_until(
    ctx: DaemonContext, acquiring: asyncio.Future[Started], framer: Framer, cancelled: asyncio.Event
) -> AsyncIterator[str]:
    """A heartbeat every ``heartbeat_seconds`` until the lease is granted
    (or its wait fails: the caller reads which), or the request is cancelled."""
    stopper = asyncio.ensure_future(cancelled.wait())
    try:
        while True:
            done, _ = await asyncio.wait(
                {acquiring, stopper}, timeout=ctx.settings.heartbeat_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return
            yield framer.heartbeat
    finally:
        stopper.cancel()


async def _stop(producer: asyncio.Future[None]) -> None:
    producer.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await producer


async def _frames(
    ctx: DaemonContext,
    plan: Plan,
    started: Started | None,
    framer: Framer,
    pending: asyncio.Future[Started] | None,
    ticket: InFlightRequest,
) -> AsyncIterator[str]:
    state = _StreamState(ctx, plan, framer, ticket.capture, ticket.request_id)
    ticket.meter = state.meter
    queue = StreamInbox()
    producer: asyncio.Future[None] | None = None
    heartbeat = ctx.settings.heartbeat_seconds
    inactivity = ctx.settings.server.request_timeout_s
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None
    deadline: asyncio.TimerHandle | None = None
    try:
        opening = framer.opening()
        if opening:
            yield opening
        if started is None:
            assert pending is not None
            try:
                async for beat in _heartbeats_until(ctx, pending, framer, ticket.cancelled):
                    yield beat
                if ticket.cancelled.is_set():
                    # Still queued (or loading): it leaves the queue.
                    await _abandon(pending)
                    pending = None
                    yield "".join(state.cancel()) + framer.closing(state.usage)
                    return
                started = pending.result()
            except Exception as exc:
                state.fail(exc)
                if state.status == 500:
                    log.error("stream on %s failed (request_id=%s): %s", plan.name, ticket.request_id,
                              describe_exception(exc))
                yield framer.error(exc) + framer.closing(None)
                return
        state.events = _choice_events(plan, started)
        producer = asyncio.ensure_future(_pump(started, started.requests, queue))
        if plan.timeout_asked:
            # Its wait for the lease was bounded by the same deadline (start's acquire).
            deadline = loop.call_later(max(0.0, plan.remaining()), queue.put_nowait, _DEADLINE)
        ticket.on_cancel(lambda: queue.put_nowait(_CANCEL))
        last_progress = loop.time()

        def tick() -> None:
            # Not re-armed per item (a timer handle per token): when it fires
            # after an item came, it sleeps again until the interval since
            # that item is over, and wakes the stream only after a quiet one.
            nonlocal timer
            quiet = loop.time() - last_progress
            if quiet >= heartbeat:
                queue.put_nowait(_TICK)  # re-armed when the stream reads it
            else:
                timer = loop.call_later(heartbeat - quiet, tick)

        timer = loop.call_later(heartbeat, tick)
        done = False
        while not done:
            item = await queue.get()
            if item is _TICK:
                timer = loop.call_later(heartbeat, tick)
                if loop.time() - last_progress >= inactivity:
                    stalled = RequestTimeout(f"No output for {inactivity:.0f} seconds")
                    state.fail(stalled)
                    yield framer.error(stalled)
                    break
                yield framer.heartbeat
                continue
            last_progress = loop.time()
            out, done = state.handle(item)
            # Whatever else is already queued goes out in the same write: one
            # send per batch of tokens instead of one per token.
            while not done and not queue.empty():
                queued = queue.get_nowait()
                if queued is _TICK:
                    timer = loop.call_later(heartbeat, tick)
                    continue
                more, done = state.handle(queued)
                out += more
            text = "".join(out)
            if text:
                yield text
        closing = framer.closing(state.usage if state.status == 200 else None)
        if closing:
            yield closing
    except (GeneratorExit, asyncio.CancelledError):
        state.status = 499  # the client went away mid-stream
        state.error = "client disconnected"
        raise
    finally:
        for handle in (timer, deadline):
            if handle is not None:
                handle.cancel()
        if producer is not None:
            await _stop(producer)
        if started is not None:
            await started.close()
        elif pending is not None:
            await _abandon(pending)
        ctx.inflight.remove(ticket)
        record_request(
            ctx, state.status, plan, *state.totals(), ticket=ticket, meter=state.meter,
            cached=state.meter.cached_tokens, finish=state.finish, error=state.error,
        )


# --- answering ----------------------------------------------------------------


async def respond(
    ctx: DaemonContext,
    plan: Plan,
    request: Request,
    *,
    framer: Callable[[], Framer],
    body: Callable[[Answer], dict[str, Any]],
) -> Response:
    """The answer to ``plan``: a stream through ``framer()`` when the plan
    streams, else ``body(answer)`` as JSON. A client gone before the answer
    gets a bare 499 (for the access log; nobody reads it)."""
    request.scope.setdefault("state", {})[ACCOUNTED] = True  # its own activity row, whatever happens
    ticket = ctx.inflight.add(InFlightRequest(
        request_id=request_id_of(request.scope), response_id=plan.id, model=plan.name, surface=plan.kind,
        caller=caller_of(request).name, stream=plan.stream, generates=True,
    ))
    if ctx.captures.wants(plan.name) or ctx.captures.wants(plan.spec.name):
        ticket.capture = ctx.captures.begin(Captured(
            request_id=ticket.request_id, response_id=plan.id, model=plan.name, key=ticket.caller, surface=plan.kind,
        ))
        if plan.requests:
            plan.requests[0].capture = ticket.capture
    handed = False
    try:
        if plan.stream:
            response = await open_stream(ctx, plan, request, framer(), ticket)
            handed = True  # the stream gives the ticket back when it ends
            return response
        return JSONResponse(body(await complete(ctx, plan, request, ticket)))
    except ClientDisconnected:
        return Response(status_code=499)
    finally:
        if not handed:
            ctx.inflight.remove(ticket)
