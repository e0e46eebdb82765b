"""The residency decision core: events in, actions out.

It answers one question per event: given what is in memory, who holds leases,
who is waiting and what time it is, what must happen next? It never sleeps,
never awaits, never touches MLX and never reads a clock: every method takes
``now``. The async shell (``residency.shell``) feeds it events and carries its
actions out, so every race can be replayed here deterministically.

Invariants (tested by tests/residency/test_core_properties.py):
- committed bytes (loading + loaded + draining + unloading) never exceed the
  budget because of an admission decision;
- a model is never unloaded while a lease on it is held;
- each model has at most one instance in memory (loads are single-flight);
- when every lease is released and every transition has finished, no model is
  left in ``loading`` or ``unloading`` and no bytes stay reserved for an
  unloaded model.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from mlxd.errors import (
    CapacityUnavailable,
    MlxdError,
    ModelLoadFailed,
    ModelNotFound,
    QueueFull,
    ShuttingDown,
)
from mlxd.registry.model import ManagerSpec, ModelSpec
from mlxd.residency.actions import (
    BUDGET, EVICTED, IDLE, AbortGenerations, Action, Grant, Note, PreemptLease, Reject, StartLoad, StartUnload,
)
from mlxd.residency.preemption import Holder, to_preempt_leases
from mlxd.residency.state import (  # re-exported: the shell and the tests know them from here
    OPERATOR_UNLOAD, RELOAD, REMOVED, SHUTDOWN, Drain, DrainCause, Resident, State, Waiter,
)
from mlxd.residency.priority import FairShare
from mlxd.residency.refusals import load_failed, no_capacity
from mlxd.residency.eviction import (
    Candidate,
    to_fit_budget,
    to_make_room,
    to_pass_over,
    to_preempt,
)

GB = 1024**3


# --- actions: mlxd/residency/actions.py; state: mlxd/residency/state.py ------


def _hold_if_broken(r: Resident) -> Resident:
    """A model whose files cannot be used is failed, with the reason, from the
    moment it is registered until a reload brings usable files; no request
    or retry timer tries to load it meanwhile."""
    if r.spec.broken and r.state in (State.UNLOADED, State.FAILED):
        r.state, r.last_error, r.retry_at, r.reserved = State.FAILED, r.spec.broken, None, 0
    return r


@dataclass
class ResidencyCore:
    manager: ManagerSpec
    residents: dict[str, Resident] = field(default_factory=dict)
    waiters: list[Waiter] = field(default_factory=list)
    shutting_down: bool = False
    fair: FairShare = field(default_factory=FairShare)
    # Granted leases by request id, for preemption before the first byte.
    holders: dict[int, Holder] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def from_specs(cls, manager: ManagerSpec, specs: Iterable[ModelSpec]) -> ResidencyCore:
        core = cls(manager=manager)
        for spec in specs:
            core.residents[spec.name] = _hold_if_broken(Resident(spec=spec))
        return core

    # --- queries -------------------------------------------------------------

    @property
    def budget(self) -> int:
        return self.manager.memory_budget_bytes

    def committed(self) -> int:
        return sum(r.reserved for r in self.residents.values())

    def new_request_id(self) -> int:
        return next(self._ids)

    def queued(self, model: str) -> int:
        return sum(1 for w in self.waiters if w.model == model and w.takes_lease)

    def occupancy(self, model: str) -> tuple[int, int, int]:
        """Leases held, requests waiting for one, and how many it may hold at
        once. A model in a capacity group counts the group's: every model of
        the group shares one max_concurrency."""
        r = self.residents[model]
        if r.spec.capacity_group is None:
            return r.active, self.queued(model), r.spec.max_concurrency
        sharing = self._group(r)
        return sum(x.active for x in sharing), sum(self.queued(x.name) for x in sharing), r.spec.max_concurrency

    def next_deadline(self) -> float | None:
        """The earliest time at which ``tick`` could have something to do."""
        times: list[float] = []
        for r in self.residents.values():
            deadline = r.idle_deadline()
            if deadline is not None:
                times.append(deadline)
            if r.state is State.FAILED and r.retry_at is not None and self._has_waiters(r.name):
                times.append(r.retry_at)
        policy = self.manager.contention
        for w in self.waiters:
            if w.blocked_since is None:
                continue
            if policy.strategy == "wait_then_fail" and policy.wait_timeout_s > 0:
                times.append(w.blocked_since + policy.wait_timeout_s)
            if policy.strategy == "wait_then_preempt":
                times.append(w.blocked_since + policy.preempt_after_s)
            if policy.strategy != "fail":
                times.append(w.arrived + self.manager.max_pass_over_s)
        return min(times) if times else None

    # --- events --------------------------------------------------------------

    def request(self, request_id: int, model: str, now: float, slots: int = 1, priority: str = "default") -> list[Action]:
        """A client wants a lease on ``model`` for ``slots`` generations at
        once (a request's ``n`` choices). It is charged min(slots,
        max_concurrency) of the model's slots: no more than the model's
        charge allows run side by side, and a request can always be granted."""
        r = self.residents.get(model)
        if r is not None:
            slots = max(1, min(slots, r.spec.max_concurrency))
        return self._enqueue(Waiter(request_id, model, now, slots=slots, priority=priority), now)

    def admin_load(self, request_id: int, model: str, now: float) -> list[Action]:
        """An operator asks for ``model`` to be loaded now, backoff or not."""
        r = self.residents.get(model)
        if r is not None and r.state is State.FAILED:
            r.retry_at = None
        return self._enqueue(Waiter(request_id, model, now, takes_lease=False), now)

    def cancel(self, request_id: int, now: float) -> list[Action]:
        """The waiter went away (disconnect, timeout). A load it started goes
        on: it ends as a loaded, idle model, never stuck half-way."""
        self.waiters = [w for w in self.waiters if w.request_id != request_id]
        return self._schedule(now)

    def release(self, model: str, instance: int, now: float, slots: int = 1, request_id: int = 0) -> list[Action]:
        """A lease of ``slots`` (its Grant's, for ``request_id``) is given back."""
        self.holders.pop(request_id, None)
        r = self.residents[model]
        if r.instance != instance or r.active < slots:
            raise AssertionError(f"release of {model}#{instance} without a lease")
        r.active -= slots
        r.last_used = now
        actions: list[Action] = []
        if r.state is State.DRAINING and r.active == 0:
            actions += self._unload(r, r.drain_reason or "drained", cause=r.drain.cause.value if r.drain else IDLE)
        # The budget was lowered while every model was busy: each model that
        # goes idle is a chance to get back under it.
        actions += self._fit_budget(now, reason="over the memory budget")
        return actions + self._schedule(now)

    def preemptable(self, request_id: int, allowed: bool, now: float) -> list[Action]:
        """The request holding ``request_id``'s lease may (still) be taken
        back, or not any more: it sent its first byte (preemption.py)."""
        h = self.holders.get(request_id)
        if h is None or h.preemptable == allowed:
            return []
        h.preemptable = allowed
        return self._schedule(now) if allowed else []

    def requeue(self, request_id: int, now: float) -> list[Action]:
        """A preempted request gave its lease back and waits again, first of
        its class; the interactive request it was taken back for gets it."""
        h = self.holders.pop(request_id, None)
        if h is None:
            return []
        r = self.residents[h.model]
        self.waiters.insert(0, Waiter(request_id, h.model, h.arrived, slots=h.slots, priority=h.priority))
        promised = next((w for w in self.waiters if w.request_id == h.preempted_for), None)
        if promised is None or r.state is not State.LOADED:
            return self.release(h.model, h.instance, now, slots=h.slots)
        r.active -= h.slots
        return [self._lease(r, promised, now)] + self._schedule(now)

    def load_finished(
        self,
        model: str,
        instance: int,
        now: float,
        *,
        error: str | None = None,
        measured_bytes: int | None = None,
    ) -> list[Action]:
        r = self.residents[model]
        assert r.state is State.LOADING and r.instance == instance, (model, r.state)
        actions: list[Action] = []
        if r.load_started_at is not None:
            r.last_load_seconds = now - r.load_started_at
        if error is not None:
            actions += self._back_off(r, error, now, note=f"load of {model} failed: {error}")
            if r.removed:
                del self.residents[model]
            return actions + self._schedule(now)
        r.state = State.LOADED
        r.loaded_at = r.last_used = now
        r.load_count += 1
        r.failures = 0
        r.last_error = None
        r.retry_at = None
        if measured_bytes is not None:
            r.measured_bytes = measured_bytes
            r.reserved = max(r.reserved, measured_bytes)
        actions.append(Note("load", model, f"loaded {model} in {r.last_load_seconds or 0:.2f} s"))
        if r.removed or self.shutting_down:
            actions += self._drain(r, REMOVED if r.removed else SHUTDOWN, now)
        elif r.drain:
            # A reload or an operator's unload was asked for while it was loading.
            actions += self._drain(r, r.drain, now)
        actions += self._fit_budget(now, reason="measured footprint above estimate")
        return actions + self._schedule(now)

    def measured(self, model: str, instance: int, nbytes: int, now: float) -> list[Action]:
        """A better measurement arrived (e.g. the first generation's peak).
        It raises the model's charge; if that overshoots the budget, idle
        models make room."""
        r = self.residents.get(model)
        if r is None or r.instance != instance or nbytes <= (r.measured_bytes or 0):
            return []
        r.measured_bytes = nbytes
        if r.state in (State.LOADED, State.DRAINING, State.LOADING):
            r.reserved = max(r.reserved, nbytes)
        return self._fit_budget(now, reason="measured footprint above estimate")

    def engine_failed(self, model: str, instance: int, error: str, now: float) -> list[Action]:
        """The resident engine broke (a rank of its gang exited or stalled):
        it admits no lease from now on, its requests end (the engine has
        ended them with the error), and once the last lease is released it
        unloads and the model is failed with backoff, its memory released.
        A stale report (an older instance, or already unloading) changes nothing."""
        r = self.residents.get(model)
        if r is None or r.instance != instance or r.state not in (State.LOADED, State.DRAINING):
            return []
        r.broke = error
        actions: list[Action] = [
            Note("failure", model, f"{model} failed while loaded: {error}"),
            AbortGenerations(model, instance, error),
        ]
        return actions + self._drain(r, Drain(DrainCause.BROKE, error), now) + self._schedule(now)

    def load_abandoned(self, model: str, instance: int, now: float) -> list[Action]:
        """A load stopped because mlxd is shutting down (what it had loaded is
        discarded): the model is simply not resident, nothing failed."""
        r = self.residents[model]
        assert r.state is State.LOADING and r.instance == instance, (model, r.state)
        r.state, r.reserved = State.UNLOADED, 0
        return [Note("unload", model, f"load of {model} stopped: mlxd is shutting down")]

    def unload_finished(self, model: str, instance: int, now: float) -> list[Action]:
        r = self.residents[model]
        assert r.state is State.UNLOADING and r.instance == instance, (model, r.state)
        r.state = State.UNLOADED
        r.reserved = 0
        r.loaded_at = None
        r.drain = None
        if r.removed:
            del self.residents[model]
            return self._schedule(now)
        if r.broke is not None:
            error, r.broke = r.broke, None
            return self._back_off(r, error, now, note=f"{r.name} is down: {error}", while_loaded=True) + self._schedule(now)
        _hold_if_broken(r)
        actions = self._schedule(now)
        if r.reload_pending:
            r.reload_pending = False
            # Only into free memory: warming a model back up never evicts or
            # preempts anyone; a request for it would (by the usual policy).
            if r.state is State.UNLOADED and not self.shutting_down and r.charge() <= self.budget - self.committed():
                actions += self._start_load(r, now)
        return actions

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for r in list(self.residents.values()):
            deadline = r.idle_deadline()
            if deadline is not None and now >= deadline:
                idle = now - (r.last_used or now)
                why = f"idle for {idle:.0f} s (idle_unload_seconds={r.spec.idle_unload_seconds:g})"
                actions += self._unload(r, why, cause=IDLE)
        policy = self.manager.contention
        if policy.strategy == "wait_then_fail" and policy.wait_timeout_s > 0:
            for w in list(self.waiters):
                if w.blocked_since is not None and now >= w.blocked_since + policy.wait_timeout_s:
                    self.waiters.remove(w)
                    actions.append(Reject(w.request_id, self._capacity_error(w.model, waited=now - w.arrived)))
        return actions + self._schedule(now)

    def admin_unload(self, model: str, now: float) -> list[Action]:
        """Unload now if idle; otherwise stop admitting and unload when drained.
        Pinned models too: the operator asked explicitly."""
        r = self.residents[model]
        if r.state in (State.LOADED, State.LOADING):
            return self._drain(r, OPERATOR_UNLOAD, now) + self._schedule(now)
        return []

    def set_pinned(self, model: str, pinned: bool, now: float) -> list[Action]:
        """An operator's pin, until the next reload: a pinned model is
        neither unloaded when idle nor evicted."""
        r = self.residents[model]
        r.spec = replace(r.spec, pinned=pinned)
        return self._schedule(now)

    def begin_shutdown(self, now: float) -> list[Action]:
        self.shutting_down = True
        actions: list[Action] = []
        for w in self.waiters:
            actions.append(Reject(w.request_id, ShuttingDown("mlxd is shutting down", retry_after=5)))
        self.waiters.clear()
        for r in self.residents.values():
            if r.state in (State.LOADED, State.DRAINING):
                actions += self._drain(r, SHUTDOWN, now)
        return actions

    def abort_all(self, reason: str) -> list[Action]:
        """Forced shutdown: end every in-flight generation."""
        return [
            AbortGenerations(r.name, r.instance, reason)
            for r in self.residents.values()
            if r.active and r.state in (State.LOADED, State.DRAINING)
        ]

    def reconfigure(
        self, manager: ManagerSpec, specs: Iterable[ModelSpec], now: float,
        renames: dict[str, str] | None = None,
    ) -> list[Action]:
        """Apply a new registry as a difference. ``renames`` maps old names to
        new ones whose engine can be kept as is."""
        actions: list[Action] = []
        self.manager = manager
        new_specs = {s.name: s for s in specs}
        for old, new in (renames or {}).items():
            if old in self.residents and new not in self.residents:
                r = self.residents.pop(old)
                self.residents[new] = r
                for w in [*self.waiters, *self.holders.values()]:
                    if w.model == old:
                        w.model = new
                for x in self.residents.values():
                    if x.drain and x.drain.for_model == old:
                        x.drain = replace(x.drain, for_model=new)
        for name, r in list(self.residents.items()):
            spec = new_specs.get(name)
            if spec is None:
                r.removed = True
                r.reload_pending = False
                for w in [w for w in self.waiters if w.model == name]:
                    self.waiters.remove(w)
                    actions.append(Reject(w.request_id, ModelNotFound(name, list(new_specs))))
                if r.state in (State.UNLOADED, State.FAILED):
                    del self.residents[name]
                else:
                    actions += self._drain(r, REMOVED, now)
                continue
            if r.removed:
                # Removed by an earlier reconfigure and back before its drain
                # finished: it is a registered model again, not a leftover.
                self._restore(r)
            needs_reload = spec.needs_reload_from(r.spec)
            r.spec = spec
            if not needs_reload and r.state in (State.LOADING, State.LOADED, State.DRAINING):
                # A live sizing change (estimated_memory_gb) moves the charge of
                # the engine in memory now; _fit_budget below evicts for a raise.
                r.reserved = r.charge()
            if needs_reload:
                r.measured_bytes = None
                if r.state is State.FAILED:
                    r.state, r.retry_at, r.failures, r.last_error = State.UNLOADED, None, 0, None
                if r.state in (State.LOADED, State.LOADING) and not spec.broken:
                    r.reload_pending = True
                if r.state in (State.LOADED, State.LOADING, State.DRAINING):
                    actions += self._drain(r, RELOAD, now)
                _hold_if_broken(r)
        for name, spec in new_specs.items():
            if name not in self.residents:
                self.residents[name] = _hold_if_broken(Resident(spec=spec))
        actions += self._fit_budget(now, reason="budget lowered or a charge raised")
        return actions + self._schedule(now)

    # --- internals -----------------------------------------------------------

    def _restore(self, r: Resident) -> None:
        r.removed = False
        if r.drain and r.drain.cause is DrainCause.REMOVED:
            self._call_off_drain(r)

    def _call_off_drain(self, r: Resident) -> None:
        r.drain = None
        if r.state is State.DRAINING:
            r.state = State.LOADED

    def _call_off_unneeded_drains(self) -> list[Action]:
        """A model draining to make room for another goes back to serving
        once nobody waits for that other model (they timed out, went away,
        or it got its memory elsewhere): otherwise it would be unloaded for
        nobody when its last lease ends."""
        actions: list[Action] = []
        for r in self.residents.values():
            wanted_by = r.drain.for_model if r.drain else None
            if wanted_by is None or self._has_waiters(wanted_by):
                continue
            self._call_off_drain(r)
            message = f"{r.name} admits requests again: nobody waits for {wanted_by} any more"
            actions.append(Note("resume", r.name, message))
        return actions

    def _enqueue(self, waiter: Waiter, now: float) -> list[Action]:
        if self.shutting_down:
            return [Reject(waiter.request_id, ShuttingDown("mlxd is shutting down", retry_after=5))]
        r = self.residents.get(waiter.model)
        if r is None or r.removed:
            return [Reject(waiter.request_id, ModelNotFound(waiter.model, self._names()))]
        if r.spec.broken:
            return [Reject(waiter.request_id, ModelLoadFailed(
                f"Model `{r.name}` cannot be loaded: {r.spec.broken}. Fix its files, then reload the registry."
            ))]
        if r.state is State.FAILED and r.retry_at is not None and now < r.retry_at:
            return [Reject(waiter.request_id, self._failed(r, now))]
        room = r.spec.max_queue
        if r.state is not State.LOADED:
            # Waiting for a load, the first max_concurrency are the ones its slots
            # take once it is in: they queue for no slot. Counted as queued, a
            # cold model of max_queue 0 refused every request until loaded by hand.
            room += max(0, r.spec.max_concurrency - r.active)
        full = self.queued(waiter.model) >= room
        if waiter.takes_lease and full and not self._can_grant(r, waiter.slots):
            return [
                Reject(
                    waiter.request_id,
                    QueueFull(
                        f"Too many requests queued for `{waiter.model}` (max_queue={r.spec.max_queue})",
                        retry_after=1,
                    ),
                )
            ]
        self.waiters.append(waiter)
        return self._schedule(now)

    def _names(self) -> list[str]:
        return [n for r in self.residents.values() if not r.removed for n in r.spec.names()]

    def _has_waiters(self, model: str) -> bool:
        return any(w.model == model for w in self.waiters)

    def _can_grant(self, r: Resident, slots: int = 1) -> bool:
        if r.state is not State.LOADED or r.active + slots > r.spec.max_concurrency:
            return False
        if r.spec.capacity_group is None:
            return True
        # A capacity group's models (the entries on one backend) share its
        # max_concurrency: they queue here for it, so a slow backend holds
        # up only the names it serves.
        return sum(x.active for x in self._group(r)) + slots <= r.spec.max_concurrency

    def _group(self, r: Resident) -> list[Resident]:
        return [x for x in self.residents.values() if x.spec.capacity_group == r.spec.capacity_group]

    @staticmethod
    def _failed(r: Resident, now: float) -> ModelLoadFailed:
        """What a request for a failed model is told."""
        return load_failed(r.name, r.last_error, r.retry_at, now, while_loaded=r.failed_while_loaded)

    def _back_off(self, r: Resident, error: str, now: float, *, note: str, while_loaded: bool = False) -> list[Action]:
        """Failed (a load, or an engine that broke while loaded): retried after
        a backoff that doubles with each failure in a row; the waiters are told."""
        r.failures += 1
        r.last_error, r.failed_while_loaded = error, while_loaded
        backoff = min(self.manager.load_retry_backoff_s * 2 ** (r.failures - 1), self.manager.load_retry_backoff_max_s)
        r.retry_at, r.state, r.reserved = now + backoff, State.FAILED, 0
        # (An error that ends a sentence of its own ends before the retry, not with ".;".)
        actions: list[Action] = [Note("failure", r.name, f"{note.rstrip('.')}; retry in {backoff:.0f} s")]
        for w in [w for w in self.waiters if w.model == r.name]:
            self.waiters.remove(w)
            actions.append(Reject(w.request_id, self._failed(r, now)))
        return actions

    def _capacity_error(self, model: str, waited: float | None = None) -> CapacityUnavailable:
        r = self.residents[model]
        free = self.budget - self.committed()
        holders = tuple((x.name, x.spec.pinned, x.active) for x in self.residents.values()
                        if x.name != model and x.reserved > 0)
        return no_capacity(model, r.charge(), free, self.budget, r.last_load_seconds, waited, holders)

    def _unload(self, r: Resident, reason: str, *, cause: str) -> list[Action]:
        assert r.active == 0 and r.state in (State.LOADED, State.DRAINING), (r.name, r.state, r.active)
        r.state = State.UNLOADING
        unload = StartUnload(r.name, r.instance, reason, cause=cause)
        return [unload, Note("evict" if unload.evicted else "unload", r.name, f"unloading {r.name}: {reason}")]

    def _drain(self, r: Resident, drain: Drain, now: float) -> list[Action]:
        """Stop admitting; unload once the last lease is released."""
        r.drain = drain
        if r.state is State.LOADING:
            return []  # load_finished picks the drain up
        if r.state in (State.LOADED, State.DRAINING):
            if r.active == 0:
                return self._unload(r, drain.reason, cause=drain.cause.value)
            r.state = State.DRAINING
        return []

    def _fit_budget(self, now: float, reason: str) -> list[Action]:
        """After the budget shrank or a model measured larger than estimated,
        unload idle models (least recently used first) until committed fits."""
        actions: list[Action] = []
        for name in to_fit_budget(self.committed() - self.budget, self._candidates()):
            actions += self._unload(self.residents[name], reason, cause=BUDGET)
        return actions

    def _candidates(self, exclude: str | None = None) -> list[Candidate]:
        """Every loaded model but ``exclude``, as eviction sees it."""
        return [
            Candidate(r.name, r.reserved, r.last_used or 0.0, busy=r.active > 0, pinned=r.spec.pinned)
            for r in self.residents.values()
            # A model that holds no memory (a remote entry): unloading it would free nothing.
            if r.state is State.LOADED and r.name != exclude and r.spec.holds_memory
        ]

    def _leaving(self) -> int:
        """Bytes already on their way out: they count toward any plan."""
        leaving = (State.UNLOADING, State.DRAINING)
        return sum(x.reserved for x in self.residents.values() if x.state in leaving)

    def _schedule(self, now: float) -> list[Action]:
        actions: list[Action] = []
        while True:
            actions += self._schedule_once(now)
            # Scheduling answers waiters; a drain made for those is no longer
            # needed, and the model it stopped may admit its own queue again.
            called_off = self._call_off_unneeded_drains()
            if not called_off:
                return actions
            actions += called_off

    def _schedule_once(self, now: float) -> list[Action]:
        actions: list[Action] = []
        # 1. Serve resident models at once: they never wait behind another
        #    model's swap. Which of a model's waiters is next is the fair
        #    share's (priority.py); one of several slots that does not fit yet
        #    holds back its model (or capacity group), else a stream of single
        #    ones would starve it.
        held_back: set[tuple[str, str]] = set()
        for w in list(self.waiters):
            r = self.residents[w.model]
            if not w.takes_lease and r.state is State.LOADED:
                self.waiters.remove(w)
                actions.append(Grant(w.request_id, w.model, r.instance, takes_lease=False))
        for model in self._models_by_oldest_waiter():
            r = self.residents[model]
            queue = ("group", r.spec.capacity_group) if r.spec.capacity_group else ("model", r.name)
            while r.state is State.LOADED and queue not in held_back:
                active, _, capacity = self.occupancy(model)
                waiting = [w for w in self.waiters if w.model == model and w.takes_lease]
                picked = self.fair.choose(model, waiting, active, capacity)
                if picked is None:
                    break
                if not self._can_grant(r, picked.slots):
                    held_back.add(queue)
                    break
                actions.append(self._lease(r, picked, now))
            if r.state is State.LOADED and r.spec.capacity_group is None:
                actions += self._preempt_bulk(r)
        # 2. Start loads, oldest waiting model first. Once the oldest one is
        #    blocked on memory no younger one may jump ahead: that is what
        #    keeps a big model from starving behind small ones.
        for model in self._models_by_oldest_waiter():
            r = self.residents[model]
            if r.state is State.FAILED and r.retry_at is not None and now < r.retry_at:
                continue
            if r.state not in (State.UNLOADED, State.FAILED):
                continue
            need = r.charge()
            if need > self.budget:
                actions += self._reject_model(
                    model,
                    CapacityUnavailable(
                        f"Model `{model}` needs {need / GB:.2f} GB, more than the whole memory "
                        f"budget of {self.budget / GB:.2f} GB.",
                        code="model_too_large",
                    ),
                )
                continue
            free = self.budget - self.committed()
            if need <= free:
                actions += self._start_load(r, now)
                continue
            actions += self._make_room(r, need, free, now)
            if self._has_waiters(model) and need <= self._reachable(model):
                break
            # Either its waiters were turned away (policy "fail"), or it cannot
            # fit until an operator unloads a pinned model: it must not hold
            # up the models behind it.
        # Every request still waiting for a model that is not loading is
        # waiting for memory: its contention clock runs from now.
        for w in self.waiters:
            if w.blocked_since is None and self.residents[w.model].state in (State.UNLOADED, State.FAILED):
                w.blocked_since = now
        # 3. Fairness: a request passed over too long stops admission of the
        #    models in its way, so they drain and it gets its turn.
        actions += self._enforce_pass_over_bound(now)
        return actions

    def _lease(self, r: Resident, w: Waiter, now: float) -> Grant:
        self.fair.served(r.name, w.priority)
        self.waiters.remove(w)
        r.active += w.slots
        r.last_used = now
        self.holders[w.request_id] = Holder(w.request_id, r.name, r.instance, w.priority, w.slots, w.arrived, now)
        return Grant(w.request_id, r.name, r.instance, slots=w.slots)

    def _preempt_bulk(self, r: Resident) -> list[Action]:
        """Interactive requests still waiting for a full model take back bulk
        leases that have sent nothing yet."""
        waiting = [w for w in self.waiters if w.model == r.name and w.takes_lease]
        held = [h for h in self.holders.values() if h.model == r.name]
        actions: list[Action] = []
        for h, waiter in to_preempt_leases(held, waiting):
            h.preempted_for = waiter
            reason = f"bulk request {h.request_id} gives its slot of {r.name} to an interactive one before its first byte"
            actions += [PreemptLease(h.request_id, r.name, h.instance, reason), Note("preempt", r.name, reason)]
        return actions

    def _reachable(self, model: str) -> int:
        """Memory ``model`` could get by waiting: all but what pinned models hold."""
        pinned = sum(r.reserved for r in self.residents.values() if r.spec.pinned and r.name != model)
        return self.budget - pinned

    def _models_by_oldest_waiter(self) -> list[str]:
        seen: dict[str, None] = {}
        for w in sorted(self.waiters, key=lambda w: w.arrived):
            seen.setdefault(w.model, None)
        return list(seen)

    def _start_load(self, r: Resident, now: float) -> list[Action]:
        r.state = State.LOADING
        r.instance += 1
        r.reserved = r.charge()
        r.load_started_at = now
        r.drain = None
        for w in self.waiters:
            if w.model == r.name:
                w.blocked_since = None
        return [StartLoad(r.name, r.instance)]

    def _reject_model(self, model: str, error: MlxdError) -> list[Action]:
        actions: list[Action] = []
        for w in [w for w in self.waiters if w.model == model]:
            self.waiters.remove(w)
            actions.append(Reject(w.request_id, error))
        return actions

    def _make_room(self, r: Resident, need: int, free: int, now: float) -> list[Action]:
        """Plan all-or-nothing: nothing is evicted unless the plan makes ``r`` fit."""
        available = free + self._leaving()
        victims = to_make_room(need, available, self._candidates(exclude=r.name))
        if victims is None:
            return self._contend(r, need, available, now)
        actions: list[Action] = []
        for name in victims:
            v = self.residents[name]
            idle = now - (v.last_used or now)
            actions += self._unload(
                v,
                f"evicted to make room for {r.name}: needed {need / GB:.2f} GB, "
                f"{v.name} idle {idle:.0f} s, least recently used",
                cause=EVICTED,
            )
        return actions

    def _contend(self, r: Resident, need: int, available: int, now: float) -> list[Action]:
        policy = self.manager.contention
        waiters = [w for w in self.waiters if w.model == r.name]
        for w in waiters:
            if w.blocked_since is None:
                w.blocked_since = now
        if policy.strategy == "fail":
            return self._reject_model(r.name, self._capacity_error(r.name))
        blocked_since = min(w.blocked_since for w in waiters if w.blocked_since is not None)
        if policy.strategy == "preempt" or (
            policy.strategy == "wait_then_preempt" and now >= blocked_since + policy.preempt_after_s
        ):
            return self._preempt_for(r, need, available, now)
        return []

    def _preempt_for(self, r: Resident, need: int, available: int, now: float) -> list[Action]:
        plan = to_preempt(need, available, self._candidates(exclude=r.name))
        if plan is None:
            return []  # even preemption cannot make room: keep waiting
        actions: list[Action] = []
        for name in plan.evict:
            actions += self._unload(self.residents[name], f"evicted to make room for {r.name}", cause=EVICTED)
        reason = f"preempted for {r.name}: needed {need / GB:.2f} GB"
        drain = Drain(DrainCause.PREEMPTED, reason, for_model=r.name)
        for name in plan.drain:
            v = self.residents[name]
            actions.append(AbortGenerations(v.name, v.instance, reason))
            actions.append(Note("preempt", v.name, reason))
            actions += self._drain(v, drain, now)
        return actions

    def _enforce_pass_over_bound(self, now: float) -> list[Action]:
        if self.manager.contention.strategy == "fail":
            return []
        overdue = [
            w for w in self.waiters
            if w.blocked_since is not None and now >= w.arrived + self.manager.max_pass_over_s
        ]
        if not overdue:
            return []
        head = min(overdue, key=lambda w: w.arrived)
        r = self.residents[head.model]
        if r.state not in (State.UNLOADED, State.FAILED):
            return []
        need = r.charge()
        available = self.budget - self.committed() + self._leaving()
        victims = to_pass_over(need, available, self._candidates(exclude=r.name))
        if victims is None:
            return []
        reason = f"draining so {r.name} can load: a request has waited {now - head.arrived:.0f} s"
        drain = Drain(DrainCause.PASS_OVER, reason, for_model=r.name)
        actions: list[Action] = []
        for name in victims:
            actions.append(Note("drain", name, reason))
            actions += self._drain(self.residents[name], drain, now)
        return actions

