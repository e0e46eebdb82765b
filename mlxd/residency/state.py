"""The residency core's state: each model's (``Resident``), each waiting
request's (``Waiter``), and why a model drains. Plain mutable values the core
(``residency.core``, which re-exports them) owns and changes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from mlxd.registry.model import ModelSpec


class State(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    # Loaded, admits no new leases, unloads when the last lease is released.
    DRAINING = "draining"
    UNLOADING = "unloading"
    FAILED = "failed"


class DrainCause(str, Enum):
    """Why a model stopped admitting leases and will unload once idle."""

    OPERATOR = "operator"
    SHUTDOWN = "shutdown"
    REMOVED = "removed"
    RELOAD = "reload"
    # The two below free memory for another model (``Drain.for_model``):
    # they are called off when nobody waits for that model any more.
    PREEMPTED = "preempted"
    PASS_OVER = "pass_over"
    # The engine broke under its leases (a parallel model's rank died): it
    # unloads once they are released and is then failed, with backoff.
    BROKE = "broke"


@dataclass(frozen=True)
class Drain:
    cause: DrainCause
    reason: str  # for operators: status, logs, the unload hooks
    for_model: str | None = None


OPERATOR_UNLOAD = Drain(DrainCause.OPERATOR, "unloaded by operator")
SHUTDOWN = Drain(DrainCause.SHUTDOWN, "shutdown")
REMOVED = Drain(DrainCause.REMOVED, "removed from the registry")
RELOAD = Drain(DrainCause.RELOAD, "configuration changed; reloading")


@dataclass
class Resident:
    spec: ModelSpec
    state: State = State.UNLOADED
    instance: int = 0
    active: int = 0
    reserved: int = 0
    last_used: float | None = None
    loaded_at: float | None = None
    load_started_at: float | None = None
    last_load_seconds: float | None = None
    measured_bytes: int | None = None
    load_count: int = 0
    failures: int = 0
    last_error: str | None = None
    retry_at: float | None = None
    drain: Drain | None = None
    removed: bool = False
    # It was in memory when a reload-class change arrived: load it again
    # once the old instance has unloaded, so the warm set stays warm.
    reload_pending: bool = False
    # Why the engine broke while resident (``engine_failed``): once it has
    # unloaded, the model is failed with this error and backs off.
    broke: str | None = None
    # The last failure was the engine breaking while loaded, not a load.
    failed_while_loaded: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def drain_reason(self) -> str | None:
        return self.drain.reason if self.drain else None

    def charge(self) -> int:
        """Admission uses the larger of the estimate and what was measured."""
        return max(self.spec.charge_bytes, self.measured_bytes or 0)

    def idle_deadline(self) -> float | None:
        if (
            self.state is not State.LOADED
            or self.active
            or self.spec.pinned
            or self.spec.idle_unload_seconds <= 0
            or self.last_used is None
        ):
            return None
        return self.last_used + self.spec.idle_unload_seconds


@dataclass
class Waiter:
    request_id: int
    model: str
    arrived: float
    # Admin loads wait for the model to be loaded but take no lease.
    takes_lease: bool = True
    # Set when the model cannot fit and the contention policy waits.
    blocked_since: float | None = None
    # Slots of max_concurrency the lease will hold (see ``request``).
    slots: int = 1
    priority: str = "default"  # the caller's class (residency/priority.py)
