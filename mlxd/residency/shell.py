"""The async shell around the residency core.

It owns what the core must not: engines, tasks, timers and futures. Every
public method feeds one event to the core and carries out the actions that
come back, all on the event loop thread, so the core needs no lock. Slow work
(loading, saving a cache, unloading) runs in tasks and returns as another
event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mlxd.caller import ANONYMOUS, Caller
from mlxd.engine.types import Engine, FailsWhole
from mlxd.errors import ModelNotFound, RequestTimeout, ShuttingDown, describe_exception
from mlxd.registry.model import ModelSpec, Registry
from mlxd.residency.core import (
    AbortGenerations,
    Action,
    Grant,
    Note,
    PreemptLease,
    Reject,
    ResidencyCore,
    Resident,
    StartLoad,
    StartUnload,
    State,
)
from mlxd.residency.decisions import EventLog
from mlxd.waiting import event_set_within

log = logging.getLogger("mlxd.residency")

Clock = Callable[[], float]
# What a waiter's future gets: the resident itself rather than its name, which
# a hot reload may change before the waiter runs again; its instance; and
# the slots the lease holds.
Granted = tuple[Resident, int, int]


# Builds the engine for a spec. The registry in use is passed along (hot
# reload replaces it), so a factory never has to read the manager back.
EngineFactory = Callable[[ModelSpec, Registry], Awaitable[Engine]]


class LifecycleHooks(Protocol):
    """What the daemon wants to happen around loads and unloads (e.g. the
    prefix cache is saved before unload). Errors here are logged, never fatal.
    ``registry`` is the one in use when the unload happens."""

    async def before_unload(self, spec: ModelSpec, engine: Engine, reason: str, registry: Registry) -> None: ...


class _NoHooks:
    async def before_unload(self, spec: ModelSpec, engine: Engine, reason: str, registry: Registry) -> None:
        return None


class ResidencyObserver(Protocol):
    """Told when a load or unload has finished, e.g. to count it as a metric.
    Called on the event loop; must be quick. Errors are logged, never fatal."""

    def model_loaded(self, model: str, seconds: float) -> None: ...
    def model_load_failed(self, model: str, seconds: float) -> None: ...
    def model_unloaded(self, model: str, cause: str, evicted: bool) -> None: ...
    def model_failed(self, model: str) -> None: ...


class _NoObserver:
    def model_loaded(self, model: str, seconds: float) -> None:
        return None

    def model_load_failed(self, model: str, seconds: float) -> None:
        return None

    def model_unloaded(self, model: str, cause: str, evicted: bool) -> None:
        return None

    def model_failed(self, model: str) -> None:
        return None


def _has_interactive(registry: Registry) -> bool:
    """Whether a slot per model is kept for interactive requests: only while
    some app is interactive (otherwise it would keep one from everyone)."""
    return any(a.priority == "interactive" for a in registry.apps or ())


class Lease:
    """The right to use one engine instance until released. Release happens
    exactly once, however the request ends; extra calls are no-ops."""

    def __init__(
        self, manager: ResidencyManager, resident: Resident, instance: int, engine: Engine, caller: Caller = ANONYMOUS,
        slots: int = 1, request_id: int = 0,
    ) -> None:
        # The resident, not its name: a hot reload may rename the model
        # while the lease is held, and the release must find it.
        self._resident = resident
        self.instance = instance
        self.engine: Engine = engine
        # Who holds it (the request's caller), for the per-caller policies to come.
        self.caller = caller
        self._manager = manager
        # Slots of max_concurrency it holds (a request's n choices).
        self.slots = slots
        self.request_id = request_id
        # Set when residency takes the lease back for an interactive request
        # (the holder has sent nothing yet): see ``preemptable``.
        self.preempted = asyncio.Event()
        self._released = False

    @property
    def model(self) -> str:
        return self._resident.name

    def preemptable(self, allowed: bool) -> None:
        """Whether residency may take the lease back now: True while its
        request has sent nothing, False for good from its first byte."""
        if not self._released:
            self._manager._set_preemptable(self, allowed)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._manager._release(self.model, self.instance, self.slots, self.request_id)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class ModelView:
    """One model as the manager sees it now: plain values, safe to keep.
    Times are wall-clock (``time.time()``) or None."""

    spec: ModelSpec
    state: State
    drain_reason: str | None
    active: int
    queued: int
    reserved: int
    measured_bytes: int | None
    loaded_at: float | None
    last_used_at: float | None
    idle_unload_at: float | None
    load_count: int
    last_load_seconds: float | None
    failures: int
    last_error: str | None
    retry_at: float | None
    requests: int
    tokens_in: int
    tokens_out: int
    # The engine's own figures (``Engine.stats()``); empty when unloaded.
    engine: dict[str, Any]
    # Its last finished unload since start, or None.
    last_unload: LastUnload | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def charge(self) -> int:
        """What admission charges it, as the core's ``Resident.charge``: the
        larger of the estimate and what was measured."""
        return max(self.spec.charge_bytes, self.measured_bytes or 0)


@dataclass(frozen=True)
class Occupancy:
    """A model's state and load; for a remote entry, ``busy``, ``waiting``
    and ``capacity`` are its backend's (shared by its entries)."""

    spec: ModelSpec
    state: State
    busy: int
    waiting: int
    capacity: int


@dataclass(frozen=True)
class ManagerSnapshot:
    """Every model and the memory budget, read at one instant."""

    budget: int
    committed: int
    models: tuple[ModelView, ...]

    def model(self, name: str) -> ModelView | None:
        return next((m for m in self.models if m.name == name), None)


def _engine_stats(engine: Engine | None) -> dict[str, Any]:
    if engine is None:
        return {}
    try:
        return engine.stats()
    except Exception:  # a status read must never fail because of one engine
        return {}


@dataclass(frozen=True)
class LastUnload:
    """A finished unload: when (wall clock), its cause (``StartUnload.cause``)
    and the sentence saying why. The events ring forgets it under traffic;
    an operator asking why a model is not in memory still finds it here."""

    at: float
    cause: str
    reason: str


@dataclass
class ModelStats:
    """Per-model figures the core does not need but operators do."""

    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    last_unload: LastUnload | None = None


@dataclass
class _Model:
    """What the shell holds for one model, in one place so that a rename is
    one move."""

    stats: ModelStats = field(default_factory=ModelStats)
    # The engine in memory, if any, and the core's instance number for it.
    engine: Engine | None = None
    instance: int = 0
    # The spec the engine was built from: after a reload-class change the
    # registry's spec no longer describes the engine that is still draining,
    # and the unload hooks must see the engine's own.
    built_from: ModelSpec | None = None


class ResidencyManager:
    def __init__(
        self,
        registry: Registry,
        factory: EngineFactory,
        *,
        clock: Clock = time.monotonic,
        events: EventLog | None = None,
        hooks: LifecycleHooks | None = None,
        recall: Callable[[tuple[ModelSpec, ...]], dict[str, int]] | None = None,
        on_measured: Callable[[ModelSpec, int], None] | None = None,
        auto_tick: bool = True,
        observer: ResidencyObserver | None = None,
    ) -> None:
        self.registry = registry
        self.core = ResidencyCore.from_specs(registry.manager, registry.models)
        self.core.fair.reserve_interactive = _has_interactive(registry)
        self.events = events or EventLog()
        self._factory = factory
        self._clock = clock
        self._hooks: LifecycleHooks = hooks or _NoHooks()
        self._observer: ResidencyObserver = observer or _NoObserver()
        self._on_measured = on_measured
        self._auto_tick = auto_tick
        self._models: dict[str, _Model] = {s.name: _Model() for s in registry.models}
        self._futures: dict[int, asyncio.Future[Granted]] = {}
        # Leases whose holder may be preempted, by request id.
        self._takeable: dict[int, Lease] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # The load tasks among them: a shutdown stops these.
        self._loads: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None
        # Footprints measured in earlier runs (or before a reload re-registered
        # the model): admission starts from what the model really costs.
        self._recall = recall
        self._recall_measurements(registry.models)

    def _recall_measurements(self, specs: tuple[ModelSpec, ...]) -> None:
        if self._recall is None:
            return
        for name, nbytes in self._recall(specs).items():
            r = self.core.residents.get(name)
            if r is not None and r.measured_bytes is None and r.state is State.UNLOADED:
                r.measured_bytes = nbytes

    # --- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the timer and preload what the registry asks for. A failed
        preload marks that model failed; the others are still served."""
        if self._auto_tick and self._timer is None:
            self._timer = asyncio.create_task(self._timer_loop(), name="mlxd-residency-timer")
        await self.preload([s.name for s in self.registry.models if s.preload])

    async def preload(self, names: list[str]) -> None:
        results = await asyncio.gather(*(self.load(n) for n in names), return_exceptions=True)
        for name, result in zip(names, results):
            if isinstance(result, ShuttingDown):
                # Stopped, not failed: the stop's own log line says so.
                log.info("preload of %s stopped: mlxd is shutting down", name)
            elif isinstance(result, BaseException):
                log.warning("preload of %s failed: %s", name, describe_exception(result))

    async def shutdown(self, grace_seconds: float) -> None:
        """Stop admitting, let leases finish up to the grace, abort the rest,
        then unload everything (each unload saves its cache first)."""
        self._apply(self.core.begin_shutdown(self._clock()))
        # A model still loading would only be unloaded again once loaded: its
        # warm-up and cache restore (seconds to a minute on a large model)
        # made the stop wait past launchd's and systemd's kill timeout. The
        # engines' loaders take a cancel at their next step (the weights
        # being read on the worker finish there and are discarded).
        for task in list(self._loads):
            task.cancel()
        # The grace is real waiting, not a residency decision: loop time, even
        # when the core runs on a fake clock.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_seconds
        while self._active_leases() and loop.time() < deadline:
            await self._wait_changed(min(0.1, max(0.0, deadline - loop.time())))
        if self._active_leases():
            self._apply(self.core.abort_all("mlxd is shutting down"))
            while self._active_leases():
                await self._wait_changed(0.1)
        await self.quiesce()
        if self._timer:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None

    async def quiesce(self) -> None:
        """Wait until no load, unload or abort task is running."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- requests ------------------------------------------------------------

    def resolve(self, name: str) -> ModelSpec:
        """The model ``name`` (a name, an alias, or an implicit failover
        target's own name) stands for."""
        spec = self.registry.lookup(name)
        if spec is None and name in self.core.residents:
            spec = self.core.residents[name].spec  # a failover's `backend:model` target
        if spec is None or spec.name not in self.core.residents or self.core.residents[spec.name].removed:
            raise ModelNotFound(name, self.registry.model_names())
        return spec

    async def acquire(
        self, name: str, timeout: float | None = None, caller: Caller = ANONYMOUS, slots: int = 1
    ) -> Lease:
        """Wait for a lease on ``name`` (an alias works too) for ``slots``
        generations at once, charged min(slots, max_concurrency). ``timeout``
        bounds the wait for a load or for capacity: RequestTimeout (504)."""
        spec = self.resolve(name)
        rid = self.core.new_request_id()
        fut = self._future(rid)
        self._apply(self.core.request(rid, spec.name, self._clock(), slots=slots, priority=caller.priority))
        lease = await self._granted(rid, fut, name, timeout, caller)
        self._models[lease.model].stats.requests += 1
        return lease

    async def requeue(self, lease: Lease, timeout: float | None = None) -> Lease:
        """``lease`` was preempted (``lease.preempted``) before its request
        sent anything: give it back and wait again, first of its class, for
        a new one (maybe on a new instance)."""
        rid, name = lease.request_id, lease.model
        lease._released = True
        self._takeable.pop(rid, None)
        fut = self._future(rid)
        self._apply(self.core.requeue(rid, self._clock()))
        return await self._granted(rid, fut, name, timeout, lease.caller)

    def _future(self, rid: int) -> asyncio.Future[Granted]:
        fut: asyncio.Future[Granted] = asyncio.get_running_loop().create_future()
        self._futures[rid] = fut
        return fut

    async def _granted(
        self, rid: int, fut: asyncio.Future[Granted], name: str, timeout: float | None, caller: Caller
    ) -> Lease:
        try:
            resident, instance, held_slots = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            self._abandon(rid, fut)
            raise RequestTimeout(
                f"Request timed out after {timeout:.1f} seconds waiting for model `{name}`"
            ) from None
        except asyncio.CancelledError:
            self._abandon(rid, fut)
            raise
        held = self._models[resident.name]
        return Lease(self, resident, instance, held.engine, caller, slots=held_slots, request_id=rid)

    @contextlib.asynccontextmanager
    async def lease(self, name: str, timeout: float | None = None) -> AsyncIterator[Lease]:
        held = await self.acquire(name, timeout)
        try:
            yield held
        finally:
            held.release()

    def _abandon(self, rid: int, fut: asyncio.Future[Granted], holds_lease: bool = True) -> None:
        """The waiter is gone (disconnect or timeout). A lease granted in the
        meantime is given straight back; otherwise the core forgets the wait."""
        self._futures.pop(rid, None)
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            if not holds_lease:
                return
            resident, instance, slots = fut.result()
            self._release(resident.name, instance, slots, rid)
        elif not fut.done():
            fut.cancel()
            self._apply(self.core.cancel(rid, self._clock()))

    def _release(self, model: str, instance: int, slots: int = 1, rid: int = 0) -> None:
        self._takeable.pop(rid, None)
        self._apply(self.core.release(model, instance, self._clock(), slots=slots, request_id=rid))
        self._note_measurement(model, instance)

    def _set_preemptable(self, lease: Lease, allowed: bool) -> None:
        if allowed:
            self._takeable[lease.request_id] = lease
        else:
            self._takeable.pop(lease.request_id, None)
        self._apply(self.core.preemptable(lease.request_id, allowed, self._clock()))

    def _note_measurement(self, model: str, instance: int) -> None:
        """Engines refine their footprint after the first generation (its peak):
        the core charges the larger figure, and it is remembered for restarts."""
        held = self._models.get(model)
        r = self.core.residents.get(model)
        if held is None or held.engine is None or r is None or held.instance != instance:
            return
        measured = held.engine.measured_bytes
        if measured and measured > (r.measured_bytes or 0):
            if self._on_measured:
                self._on_measured(r.spec, measured)
            self._apply(self.core.measured(model, instance, measured, self._clock()))

    # --- admin ---------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load ``name`` now (skipping any failure backoff) and wait until it is
        loaded; raises the load's error if it fails."""
        spec = self.resolve(name)
        rid = self.core.new_request_id()
        fut: asyncio.Future[Granted] = asyncio.get_running_loop().create_future()
        self._futures[rid] = fut
        self._apply(self.core.admin_load(rid, spec.name, self._clock()))
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._abandon(rid, fut, holds_lease=False)
            raise

    async def unload(self, name: str, wait: bool = True) -> str:
        """Unload ``name``: at once if idle, else once its leases are released."""
        spec = self.resolve(name)
        self._apply(self.core.admin_unload(spec.name, self._clock()))
        if wait:
            while self.core.residents.get(spec.name) and self.core.residents[spec.name].state in (
                State.UNLOADING,
            ):
                await self._wait_changed(1.0)
        r = self.core.residents.get(spec.name)
        return r.state.value if r else "removed"

    async def settled(self, name: str) -> None:
        """Wait until ``name`` (its registered name) is neither loading nor
        unloading: a load restores its saved prefix cache and an unload saves
        it, so what is done to the cache meanwhile would be undone."""
        while (r := self.core.residents.get(name)) is not None and r.state in (State.LOADING, State.UNLOADING):
            await self._wait_changed(1.0)

    def pin(self, name: str, pinned: bool) -> None:
        """Pin or unpin ``name`` until the next reload (models.yaml's
        ``pinned`` is the lasting setting)."""
        spec = self.resolve(name)
        self._apply(self.core.set_pinned(spec.name, pinned, self._clock()))

    def renamable(self, renames: dict[str, str]) -> dict[str, str]:
        """The renames that can keep their engine. A load or unload task in
        flight knows its model by name: such a model is replaced (drained,
        registered anew) rather than renamed."""
        return {
            old: new
            for old, new in renames.items()
            if old in self.core.residents
            and new not in self.core.residents
            and self.core.residents[old].state not in (State.LOADING, State.UNLOADING)
        }

    async def reconfigure(self, registry: Registry, renames: dict[str, str] | None = None) -> list[str]:
        """Apply ``registry`` as a difference (see ``ResidencyCore.reconfigure``).
        ``renames`` maps old names to new ones whose engine is kept. Returns the
        models now being preloaded in the background: added ones, and those
        whose ``preload`` was just switched on."""
        renames = self.renamable(renames or {})
        before = {name: r.spec for name, r in self.core.residents.items() if not r.removed}
        for old, new in renames.items():
            self._models[new] = self._models.pop(old, None) or _Model()
            if old in before:
                before[new] = before.pop(old)
        self.registry = registry
        self.core.fair.reserve_interactive = _has_interactive(registry)
        for spec in registry.models:
            held = self._models.setdefault(spec.name, _Model())
            if held.built_from is not None and not spec.needs_reload_from(held.built_from):
                held.built_from = spec
        self._apply(self.core.reconfigure(registry.manager, registry.models, self._clock(), renames))
        self._forget_gone()
        self._recall_measurements(registry.models)
        warm = [
            s.name
            for s in registry.models
            if s.preload
            and (s.name not in before or not before[s.name].preload)
            and self.core.residents[s.name].state is State.UNLOADED
        ]
        for name in warm:
            self._spawn(self.preload([name]), f"preload-{name}")
        return warm

    def tick(self) -> None:
        """Let time-driven decisions happen (idle unloads, wait timeouts). The
        timer calls this; tests with a fake clock call it by hand."""
        self._apply(self.core.tick(self._clock()))

    # --- queries -------------------------------------------------------------

    @property
    def stats(self) -> dict[str, ModelStats]:
        """Request and token counts per model (the objects themselves: the
        request path adds its tokens to them)."""
        return {name: held.stats for name, held in self._models.items()}

    def view(self, name: str) -> ModelView | None:
        """``name`` (its registered name) as plain values; None if unknown."""
        r = self.core.residents.get(name)
        if r is None:
            return None
        held = self._models.get(name)
        stats = held.stats if held else ModelStats()
        return ModelView(
            spec=r.spec,
            state=r.state,
            drain_reason=r.drain_reason,
            active=r.active,
            queued=self.core.queued(name),
            reserved=r.reserved,
            measured_bytes=r.measured_bytes,
            loaded_at=self.wall_time(r.loaded_at),
            last_used_at=self.wall_time(r.last_used),
            idle_unload_at=self.wall_time(r.idle_deadline()),
            load_count=r.load_count,
            last_load_seconds=r.last_load_seconds,
            failures=r.failures,
            last_error=r.last_error,
            retry_at=self.wall_time(r.retry_at) if r.state is State.FAILED else None,
            requests=stats.requests,
            tokens_in=stats.tokens_in,
            tokens_out=stats.tokens_out,
            engine=_engine_stats(self.engine(name)),
            last_unload=stats.last_unload,
        )

    def snapshot(self) -> ManagerSnapshot:
        views = (self.view(name) for name in list(self.core.residents))
        return ManagerSnapshot(
            budget=self.core.budget,
            committed=self.core.committed(),
            models=tuple(v for v in views if v is not None),
        )

    def occupancy(self, name: str) -> Occupancy | None:
        """How busy ``name`` (its registered name) is now, cheaply: what a
        failover entry needs to pick a target for each request."""
        r = self.core.residents.get(name)
        if r is None or r.removed:
            return None
        busy, waiting, capacity = self.core.occupancy(name)
        return Occupancy(r.spec, r.state, busy, waiting, capacity)

    @property
    def shutting_down(self) -> bool:
        return self.core.shutting_down

    def count_tokens(self, name: str, tokens_in: int, tokens_out: int) -> None:
        """Add a finished request's tokens to the model's figures."""
        held = self._models.get(name)
        if held is not None:
            held.stats.tokens_in += tokens_in
            held.stats.tokens_out += tokens_out

    def engine(self, name: str) -> Engine | None:
        held = self._models.get(name)
        return held.engine if held else None

    def wall_time(self, t: float | None) -> float | None:
        """Core timestamps are on the injected (monotonic) clock; status shows wall time."""
        return None if t is None else time.time() - (self._clock() - t)

    def _active_leases(self) -> int:
        return sum(r.active for r in self.core.residents.values())

    # --- carrying actions out ------------------------------------------------

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Grant):
                self._grant(action)
            elif isinstance(action, Reject):
                fut = self._futures.pop(action.request_id, None)
                if fut is not None and not fut.done():
                    fut.set_exception(action.error)
            elif isinstance(action, StartLoad):
                load = self._spawn(self._load(action.model, action.instance), f"load-{action.model}")
                self._loads.add(load)
                load.add_done_callback(self._loads.discard)
            elif isinstance(action, StartUnload):
                self._spawn(self._unload(action), f"unload-{action.model}")
            elif isinstance(action, AbortGenerations):
                self._spawn(self._abort(action), f"abort-{action.model}")
            elif isinstance(action, PreemptLease):
                preempted = self._takeable.get(action.request_id)
                if preempted is not None:
                    preempted.preempted.set()
            elif isinstance(action, Note):
                self.events.add(action.kind, action.model, action.message)
                log.info("%s", action.message)
        self._changed.set()
        self._wake.set()

    def _grant(self, action: Grant) -> None:
        fut = self._futures.pop(action.request_id, None)
        if fut is None or fut.done():
            # Nobody is waiting any more: hand the lease straight back.
            if action.takes_lease:
                self._release(action.model, action.instance, action.slots, action.request_id)
            return
        fut.set_result((self.core.residents[action.model], action.instance, action.slots))

    def _spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, model: str, instance: int) -> None:
        spec = self.core.residents[model].spec
        started = time.monotonic()
        try:
            engine = await self._factory(spec, self.registry)
        except asyncio.CancelledError:  # only a shutdown cancels a load
            self._apply(self.core.load_abandoned(model, instance, self._clock()))
            raise
        except Exception as exc:  # any failure becomes the model's failed state
            reason = describe_exception(exc)
            log.error("loading %s failed: %s", model, reason)
            self._apply(self.core.load_finished(model, instance, self._clock(), error=reason))
            self._observe(self._observer.model_load_failed, model, time.monotonic() - started)
            return
        held = self._models.setdefault(model, _Model())
        held.engine, held.instance, held.built_from = engine, instance, spec
        measured = engine.measured_bytes
        if measured and self._on_measured:
            self._on_measured(spec, measured)
        self._apply(self.core.load_finished(model, instance, self._clock(), measured_bytes=measured))
        self._observe(self._observer.model_loaded, model, time.monotonic() - started)
        if isinstance(engine, FailsWhole):
            self._spawn(self._watch_failure(model, instance, engine), f"watch-{model}")

    async def _watch_failure(self, model: str, instance: int, engine: FailsWhole) -> None:
        """Until the engine unloads: if it breaks, the model goes down whole
        and backs off (``ResidencyCore.engine_failed``)."""
        watch = asyncio.ensure_future(engine.failure())
        try:
            while True:
                held = self._models.get(model)
                if held is None or held.engine is not engine:
                    return  # unloaded (or replaced) first
                done, _ = await asyncio.wait({watch}, timeout=1.0)
                if done:
                    break
            reason = watch.result()
        finally:
            watch.cancel()
        held = self._models.get(model)
        if held is not None and held.engine is engine:
            self._apply(self.core.engine_failed(model, instance, reason, self._clock()))
            self._observe(self._observer.model_failed, model)

    async def _unload(self, action: StartUnload) -> None:
        model = action.model
        held = self._models.get(model) or _Model()
        engine, spec = held.engine, held.built_from or self.core.residents[model].spec
        held.engine = held.built_from = None
        if engine is not None:
            try:
                await self._hooks.before_unload(spec, engine, action.reason, self.registry)
            except Exception as exc:
                log.warning("before unloading %s: %s", model, describe_exception(exc))
            try:
                await engine.close()
            except Exception as exc:
                log.warning("closing %s: %s", model, describe_exception(exc))
        self._apply(self.core.unload_finished(model, action.instance, self._clock()))
        if model in self._models:
            self._models[model].stats.last_unload = LastUnload(time.time(), action.cause, action.reason)
        self._forget_gone()
        self._observe(self._observer.model_unloaded, model, action.cause, action.evicted)

    def _forget_gone(self) -> None:
        """Drop what the shell holds for models the core no longer knows
        (removed from the registry and unloaded)."""
        gone = [n for n, held in self._models.items() if held.engine is None and n not in self.core.residents]
        for name in gone:
            del self._models[name]

    def _observe(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception as exc:  # observing must never break residency
            log.warning("residency observer %s: %s", callback.__name__, describe_exception(exc))

    async def _abort(self, action: AbortGenerations) -> None:
        held = self._models.get(action.model)
        if held is None or held.engine is None or held.instance != action.instance:
            return
        try:
            await held.engine.abort_all(action.reason)
        except Exception as exc:
            log.warning("aborting %s: %s", action.model, describe_exception(exc))

    async def _wait_changed(self, timeout: float) -> None:
        self._changed.clear()
        await event_set_within(self._changed, timeout)

    async def _timer_loop(self) -> None:
        while True:
            self._wake.clear()
            deadline = self.core.next_deadline()
            timeout = None if deadline is None else max(0.0, deadline - self._clock())
            await event_set_within(self._wake, timeout)
            try:
                self.tick()
            except Exception:  # a bug here must not stop idle unloads for good
                log.exception("residency tick failed")
