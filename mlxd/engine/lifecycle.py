"""What every engine does alike, whatever library runs its model.

- in-flight bookkeeping: each request has a ``GenerationControl`` the event
  loop flags (abort) and the worker reads;
- ``close()`` that aborts what runs and frees memory only once the worker has
  let go of the model;
- the measured footprint: the load's cost, raised to the first generation's
  peak;
- a load that survives its caller's cancellation without leaving memory
  behind (``load_on_worker``).

``TextEngine`` (mlx-lm) and ``VisionEngine`` (mlx-vlm) subclass ``EngineBase``
(and ``GenerationEngine``, the request path's contract) and supply how a
generation runs and how their model is dropped; the encoder and audio
engines subclass it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from mlxd.caller import urgency
from mlxd.engine import memory
from mlxd.engine.generation_pace import GenerationPace
from mlxd.engine.types import GenerationChunk, GenerationRequest, SavedCache
from mlxd.engine.stops import StopMatcher
from mlxd.engine.warmup import WarmupReport
from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.errors import MlxdError, ModelLoadFailed, ModelUnloaded, ShuttingDown, describe_exception
from mlxd.registry.model import ModelSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# The abort reason of a warm-up request a user request pushed aside.
PREEMPTED = "preempted by a user request"


@dataclass(eq=False)
class GenerationControl:
    """One in-flight request; the event loop flags it, the worker reads the flag."""

    request_id: str
    abort_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The prompt's token ids when they were computed before the worker saw
    # the request (``EngineBase._before_worker``).
    prompt_ids: list[int] | None = None
    # The chat prompt ended inside a reasoning block its template opened:
    # said on the request's first chunk (GenerationChunk.opens_reasoning).
    opens_reasoning: bool = False
    # Where a model whose cache cannot be trimmed checkpoints this prompt
    # (``engine/checkpoints.py``), computed with ``prompt_ids``.
    prompt_boundaries: list[Any] | None = None
    # The engine's own warm-up (``GenerationRequest.warmup``): not counted,
    # and it gives way to any user request.
    warmup: bool = False
    # The caller's priority class: what encoder passes beside it are paced for.
    priority: str = "default"


@dataclass
class GenerationCounts:
    """Figures for ``stats()``: written only on the worker thread, read anywhere.

    Every path (single text, batched text, vision) accounts a generation the
    same way: ``begin`` when it takes the model, ``end`` when it lets go,
    ``abort`` when it ended with finish_reason "abort". A warm-up request
    holds the model (``running``) but adds nothing to the totals, which
    describe user traffic only.
    """

    running: int = 0
    generations: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    aborted: int = 0

    def begin(self, control: GenerationControl) -> None:
        self.running += 1
        if not control.warmup:
            self.generations += 1

    def end(self, control: GenerationControl) -> None:
        self.running -= 1
        if not control.warmup:
            self.prompt_tokens += control.prompt_tokens
            self.tokens_generated += control.completion_tokens

    def abort(self, control: GenerationControl) -> None:
        if not control.warmup:
            self.aborted += 1

    @contextlib.contextmanager
    def generation(self, control: GenerationControl) -> Iterator[None]:
        """``begin`` ... ``end`` around one generation, however it ends."""
        self.begin(control)
        try:
            yield
        finally:
            self.end(control)


class FirstGenerationPeak:
    """The model's footprint: its load, raised to the first generation's peak
    (KV cache and activations included). Worker thread, but for reading."""

    def __init__(self, load_bytes: int) -> None:
        self.load_bytes = load_bytes
        # Peak bytes attributable to this model during its first generation.
        self.peak_bytes: int | None = None
        self._pending = True

    @property
    def measured_bytes(self) -> int:
        return max(self.load_bytes, self.peak_bytes or 0)

    @property
    def pending(self) -> bool:
        """Whether the first generation, whose peak is measured, is still to come."""
        return self._pending

    def begin(self) -> int | None:
        """On the first generation: reset MLX's peak; return the bytes not ours."""
        if not self._pending:
            return None
        self._pending = False
        others = max(0, memory.active_bytes() - self.load_bytes)
        memory.reset_peak()
        return others

    def end(self, others: int | None) -> None:
        """After that first generation: its peak, less what was not ours, is our cost."""
        if others is not None:
            self.peak_bytes = max(0, memory.peak_bytes() - others)

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        others = self.begin()
        try:
            yield
        finally:
            self.end(others)


class EngineBase:
    kind = ""
    # Every generation's first chunk is an empty one, once the request has
    # passed every check of its content (tokenized, within the context): a
    # stream answers 200 only after it, so a prompt that does not fit is a
    # real 400 rather than an error frame inside a 200 (the generation
    # contract, ``engine/contract.py``). Where that chunk comes from: here, once ``_before_worker`` has checked
    # the request, or (True) from the subclass's own ``_run`` on the worker,
    # where it checks what needs the model (a vision prompt's images).
    accepts_on_worker = False

    def __init__(self, spec: ModelSpec, worker: MlxWorker, *, load_bytes: int, load_seconds: float,
                 warmup: WarmupReport | None = None) -> None:
        self.name = spec.name
        self.spec = spec
        self._worker = worker
        self.load_bytes = load_bytes
        self.load_seconds = load_seconds
        # The load's warm-up (``warm_after_load``; a text model's own, engine/warmup.py), for status.
        self.warmup = warmup
        self.peak = FirstGenerationPeak(load_bytes)
        # Touched only on the event loop.
        self._in_flight: set[GenerationControl] = set()
        # User requests in flight, and whether there are none: a warm-up
        # request gives way to every user request (``_generate``).
        self._users = 0
        self._no_users = asyncio.Event()
        self._no_users.set()
        # Background work on the model that gives way to users as a warm-up
        # does (``yielding``): not requests, so not in flight.
        self._background: set[GenerationControl] = set()
        self._closed = False
        self.counts = GenerationCounts()

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_idle(self) -> None:
        """Until no user request is in flight (event loop)."""
        await self._no_users.wait()

    @contextlib.contextmanager
    def yielding(self, name: str) -> Iterator[GenerationControl]:
        """Event loop: a control for background work on the model that gives
        way to users as a warm-up request does: its ``abort_reason`` is set
        when a user request arrives (at once if one is in flight) and when
        the engine closes; the work checks it before each step."""
        control = GenerationControl(name, warmup=True)
        if self._users or self._closed:
            control.abort_reason = PREEMPTED
        self._background.add(control)
        try:
            yield control
        finally:
            self._background.discard(control)

    @property
    def measured_bytes(self) -> int:
        """The model's real cost: its load footprint, raised to the first generation's peak."""
        return self.peak.measured_bytes

    @property
    def peak_bytes(self) -> int | None:
        return self.peak.peak_bytes

    def stats(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "kind": self.kind,
            "in_flight": len(self._in_flight),
            "running": counts.running,
            "generations": counts.generations,
            "prompt_tokens": counts.prompt_tokens,
            "tokens_generated": counts.tokens_generated,
            "aborted": counts.aborted,
            "load_bytes": self.load_bytes,
            "peak_bytes": self.peak_bytes,
            "measured_bytes": self.measured_bytes,
            "load_seconds": round(self.load_seconds, 3),
            "closed": self._closed,
            "warmup": self.warmup.as_dict() if self.warmup is not None else None,
        }

    async def before_unload(self) -> SavedCache | None:
        """Nothing outlives the model unless a subclass saves it."""
        return None

    async def clear_prefix_cache(self) -> bool:
        """No prefix cache unless a subclass keeps one."""
        return False

    # --- what a subclass supplies ---------------------------------------------

    def _open(self, request: GenerationRequest, control: GenerationControl) -> AsyncIterator[Any]:
        """The chunk source for one request (default: ``_run`` stepped on the worker)."""
        return self._worker.stream(lambda: self._run(request, control))

    def _run(self, request: GenerationRequest, control: GenerationControl) -> Iterator[Any]:
        raise NotImplementedError

    async def _before_worker(self, request: GenerationRequest, control: GenerationControl) -> None:
        """Event loop, before the request reaches the worker: work that needs
        no MLX (tokenizing) runs here, off the thread every model shares."""

    def _busy(self) -> bool:
        """Whether a generation still holds the model (read between worker steps)."""
        return self.counts.running > 0

    def _release(self) -> dict[str, Any]:
        """Worker thread: drop the model and give its memory back."""
        raise NotImplementedError

    def _forget(self) -> None:
        """Drop the model's references when the worker is already gone."""
        raise NotImplementedError

    # --- the protocol ------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        if self._closed:
            raise ModelUnloaded(self.name)
        control = GenerationControl(request.request_id, warmup=request.warmup, priority=request.priority)
        source: Any = None
        try:
            # Registered inside the try: starting the stream can raise
            # ShuttingDown, and the entry must not outlive the request.
            self._in_flight.add(control)
            self._arrived(control)
            await self._before_worker(request, control)
            first = True
            if not self.accepts_on_worker:
                tokens = control.prompt_ids
                yield GenerationChunk(text="", prompt_tokens=len(tokens) if tokens is not None else 0,
                                      opens_reasoning=control.opens_reasoning)
                first = False
            source = self._open(request, control)
            async for chunk in source:
                if first:
                    chunk.opens_reasoning = control.opens_reasoning
                    first = False
                yield chunk
        except MlxdError:
            raise
        except Exception as exc:
            log.exception("generation %s on %s failed", request.request_id, self.name)
            raise MlxdError(f"The model `{self.name}` failed while generating.") from exc
        finally:
            self._in_flight.discard(control)
            self._left(control)
            # A consumer that left early: the worker drops the generation
            # before its next step (prefill chunks are steps too).
            if source is not None:
                await source.aclose()

    def _arrived(self, control: GenerationControl) -> None:
        """Event loop: a warm-up never runs beside a user request. A user's
        arrival aborts the warm-up's requests (each ends at its next step,
        so the user waits for one step at most: a prefill chunk or a token);
        a warm-up request that arrives while users are in flight ends before
        it reaches the model. The warm-up runs it again once they are gone."""
        if control.warmup:
            if self._users:
                control.abort_reason = PREEMPTED
            return
        self._users += 1
        self._no_users.clear()
        for other in (*self._in_flight, *self._background):
            if other.warmup and other.abort_reason is None:
                other.abort_reason = PREEMPTED

    def _left(self, control: GenerationControl) -> None:
        if control.warmup:
            return
        self._users -= 1
        if not self._users:
            self._no_users.set()

    async def abort_all(self, reason: str) -> int:
        for control in self._background:
            control.abort_reason = control.abort_reason or reason
        aborted = 0
        for control in list(self._in_flight):
            if control.abort_reason is None:
                control.abort_reason = reason
                aborted += 1
        return aborted

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.abort_all("unloaded")
        try:
            # Aborted generations end at their next step; none may hold the
            # model when the memory is released. The running count is written
            # on the worker mid-step: a call runs between two steps, so after
            # the first one it counts every generation that got past its
            # abort check.
            await self._worker.call(_noop)
            while self._busy():
                await self._worker.call(_noop)
            await self._worker.call(self._release)
        except ShuttingDown:
            # The worker is gone (process exit): nothing left to release on it.
            self._forget()

def _noop() -> None:
    return None


def relay(
    responses: Iterator[Any],
    control: GenerationControl,
    stops: StopMatcher,
    chunk: Callable[..., GenerationChunk],
    *,
    on_token: Callable[[Any], None] | None = None,
    on_finish: Callable[[], None] | None = None,
    pace: GenerationPace | None = None,
) -> Iterator[Any]:
    """Worker thread: turn an mlx-lm or mlx-vlm response stream into chunks,
    one per step. Ends on an abort, a stop string, the end token or
    max_tokens; ``on_finish`` runs only when the generation ended normally,
    before its last chunk goes out (a consumer may close us as soon as it has
    that chunk). ``pace``: told each decode step, as a batch loop tells it
    (engine/generation_pace.py); the step that drew the first token, after
    the prefill, is not a steady one."""

    def finished(text: str, reason: str) -> GenerationChunk:
        responses.close()  # type: ignore[attr-defined]
        if on_finish is not None:
            on_finish()
        last = chunk(text, reason)
        last.stop_sequence = stops.matched
        return last

    try:
        while True:
            if control.abort_reason is not None:
                yield chunk(stops.flush(), "abort")
                return
            try:
                response = next(responses)
            except StopIteration:
                yield finished(stops.flush(), "stop")
                return
            control.completion_tokens = response.generation_tokens
            if pace is not None:
                pace.step(time.perf_counter(), 1, steady=response.generation_tokens > 1,
                          urgency=urgency(control.priority))
            if on_token is not None:
                on_token(response)
            text, stopped = stops.feed(response.text)
            if stopped:
                yield finished(text, "stop")
                return
            if response.finish_reason is not None:
                yield finished(text + stops.flush(), response.finish_reason)
                return
            yield chunk(text) if text else SKIP
    finally:
        responses.close()  # type: ignore[attr-defined]


@dataclass
class MeasuredLoad:
    """What a load returned and what it cost."""

    result: Any
    load_bytes: int
    load_seconds: float


def warm_after_load(spec: ModelSpec, warm: Callable[[], Any]) -> WarmupReport:
    """Worker thread: ``warm()``, a model's first pass on a tiny input right
    after its load, so that the kernels MLX compiles on first use (about
    0.5 s each on this CPU, with an empty kernel cache: after a boot on a
    CPU, on a fresh CUDA machine; on Metal fused kernels are compiled in each
    process, not measured) are the load's,
    not a user's first request's. Not a request: nothing is counted, and the
    first request still measures the model's peak. A failure is logged and
    the load stands (the model's first request reports its own error); what
    the pass left in MLX's cache is given back either way. Returns what it
    took, for status (``warmup_seconds``), as a text model's warm-up does."""
    started, error = time.perf_counter(), None
    try:
        warm()
    except Exception as exc:  # noqa: BLE001 - see above
        error = describe_exception(exc)
        log.warning("warming up %s failed: %s", spec.name, error)
    finally:
        memory.release_memory()
    return WarmupReport(seconds=round(time.perf_counter() - started, 3), requests=1, prefill_tokens_per_s=None,
                        error=error)


def measured_load(spec: ModelSpec, load: Callable[[], Any], release: Callable[[], Any]) -> MeasuredLoad:
    """Worker thread: run ``load()`` and measure the active memory it added.

    Loads evaluate their weights (``lazy=False``, the mlx-lm and mlx-vlm
    default), so the figure is the real resident size. A failure frees what
    the load left behind (``release``) and becomes ``ModelLoadFailed`` with the
    details in the log only.
    """
    before = memory.active_bytes()
    started = time.perf_counter()
    try:
        result = load()
    except Exception as exc:
        log.exception("loading model %s from %s failed", spec.name, spec.path)
        release()
        raise ModelLoadFailed(
            f"The model `{spec.name}` could not be loaded ({type(exc).__name__}); "
            "see the daemon log for details."
        ) from exc
    seconds = time.perf_counter() - started
    loaded_bytes = max(0, memory.active_bytes() - before)
    log.info("loaded %s in %.2fs (%d MB)", spec.name, seconds, loaded_bytes >> 20)
    return MeasuredLoad(result, loaded_bytes, seconds)


async def load_on_worker(
    worker: MlxWorker, load: Callable[[ModelSpec], T], spec: ModelSpec, discard: Callable[[T], Any]
) -> T:
    """Run ``load(spec)`` on the worker. A load cannot be interrupted: if the
    caller is cancelled meanwhile, the load finishes and what it loaded is
    handed to ``discard`` on the worker, so a cancelled load never leaves
    memory behind."""
    task = asyncio.ensure_future(worker.call(load, spec))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: _discard_orphan(done, worker, discard))
        raise


def _discard_orphan(task: asyncio.Future[Any], worker: MlxWorker, discard: Callable[[Any], Any]) -> None:
    if task.cancelled() or task.exception() is not None or not worker.running:
        return
    loaded = task.result()
    future = asyncio.ensure_future(worker.call(discard, loaded))
    future.add_done_callback(_log_failed_discard)


def _log_failed_discard(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("unloading after a cancelled load failed: %s", describe_exception(task.exception()))
