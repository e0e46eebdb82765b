"""The shell around ``choice``: for each request on a failover entry it reads
every target's state (residency for local models and leases, the background
poll for what a backend reports) and returns the order to try them in; it
counts what each target did, for /v1/status and the dashboard.

Targets are ordinary residents: a local one leases through the residency
manager like any request (its queue, memory and max_concurrency), a remote
one through its backend's shared max_concurrency. The failover entry
itself holds nothing and has no queue of its own.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace

from mlxd.errors import describe_exception
from mlxd.failover import choice
from mlxd.registry.model import FailoverSpec, ModelSpec, Registry
from mlxd.remote.backends import BackendPool
from mlxd.residency.shell import ResidencyManager

# Requests remembered per failover entry, for "which target served the last ones".
RECENT = 10


@dataclass
class TargetCounts:
    """What one target did for one failover entry since start."""

    # Requests it took and finished (any status: the client's count).
    requests: int = 0
    # Times it failed before any output, so that the next target tried.
    fell_through: int = 0
    last_error: str | None = None
    last_error_at: float | None = None


@dataclass(frozen=True)
class Served:
    target: str
    status: int
    at: float


@dataclass
class _Counts:
    targets: dict[str, TargetCounts] = field(default_factory=dict)
    recent: deque[Served] = field(default_factory=lambda: deque(maxlen=RECENT))

    def of(self, target: str) -> TargetCounts:
        return self.targets.setdefault(target, TargetCounts())


@dataclass(frozen=True)
class TargetView:
    state: choice.Target
    counts: TargetCounts
    # Remote targets: where (None for a local one).
    backend: str | None
    remote_model: str | None


@dataclass(frozen=True)
class FailoverView:
    """A failover entry as status shows it: plain values, safe to keep."""

    spec: FailoverSpec
    # The order a request arriving now would try the targets in.
    order: tuple[str, ...]
    targets: tuple[TargetView, ...]
    recent: tuple[Served, ...]


class FailoverRouter:
    def __init__(self, manager: ResidencyManager, backends: BackendPool) -> None:
        self._manager = manager
        self._backends = backends
        self._counts: dict[str, _Counts] = {}

    def order(self, failover: FailoverSpec) -> list[ModelSpec]:
        """The targets to try for a request arriving now, best first: their
        specs as residency holds them, so that nothing resolves them again."""
        targets = self._targets(failover)
        specs = {target.name: spec for target, spec in targets}
        return [specs[name] for name in choice.order(failover.strategy, [target for target, _ in targets])]

    def _targets(self, failover: FailoverSpec) -> list[tuple[choice.Target, ModelSpec]]:
        found = (self._target(name) for name in failover.targets)
        return [t for t in found if t is not None]

    def _target(self, name: str) -> tuple[choice.Target, ModelSpec] | None:
        occupancy = self._manager.occupancy(name)
        if occupancy is None:
            return None
        spec = occupancy.spec
        load = {"busy": occupancy.busy, "waiting": occupancy.waiting, "capacity": occupancy.capacity}
        if spec.backend is None:
            return choice.Target(name, "local", occupancy.state.value, None, **load), spec
        backend = self._backends.current(spec.backend)
        if backend is None:
            return choice.Target(name, "openai", None, False, **load), spec
        stats = backend.stats
        state = stats.models.get(spec.remote_model or "") if backend.spec.kind == "mlxd" else None
        return choice.Target(name, backend.spec.kind, state, stats.reachable, **load), spec

    # --- what happened ----------------------------------------------------------

    def fell_through(self, failover: str, target: str, error: BaseException) -> None:
        counts = self._counts.setdefault(failover, _Counts()).of(target)
        counts.fell_through += 1
        counts.last_error = describe_exception(error)
        counts.last_error_at = time.time()

    def finished(self, failover: str, target: str, status: int) -> None:
        """A request on ``failover`` ended with ``status``; ``target`` served
        it (or was the last one tried, when none could)."""
        counts = self._counts.setdefault(failover, _Counts())
        counts.of(target).requests += 1
        counts.recent.append(Served(target, status, time.time()))

    def follow(self, registry: Registry) -> None:
        """After a reload (``DaemonContext.follow``): the registry's failover entries."""
        self.reconfigure(registry.failovers)

    def reconfigure(self, failovers: tuple[FailoverSpec, ...]) -> None:
        """After a reload: the figures of entries that are gone go with them
        (an edited entry keeps its own)."""
        names = {f.name for f in failovers}
        for gone in [n for n in self._counts if n not in names]:
            del self._counts[gone]

    def views(self) -> tuple[FailoverView, ...]:
        views = []
        for failover in self._manager.registry.failovers:
            counts = self._counts.get(failover.name, _Counts())
            targets = tuple(
                TargetView(
                    state=target,
                    counts=replace(counts.targets.get(target.name, TargetCounts())),
                    backend=spec.backend,
                    remote_model=spec.remote_model,
                )
                for target, spec in self._targets(failover)
            )
            order = tuple(choice.order(failover.strategy, [t.state for t in targets]))
            views.append(FailoverView(failover, order, targets, tuple(counts.recent)))
        return tuple(views)
