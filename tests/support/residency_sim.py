"""A tiny harness around the pure residency core: a fake clock, and a record
of every action, so each scenario reads like the story it tells."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mlxd.registry.model import ContentionSpec, ManagerSpec, ModelSpec
from mlxd.residency.core import (
    AbortGenerations,
    Action,
    Grant,
    PreemptLease,
    Reject,
    ResidencyCore,
    StartLoad,
    StartUnload,
    State,
)

GB = 1024**3


def spec(name: str, gb: float, **kw) -> ModelSpec:
    return ModelSpec(
        name=name,
        path=Path(f"/models/{name}"),
        source=f"/models/{name}",
        memory_override_bytes=int(gb * GB),
        **kw,
    )


def manager(budget_gb: float, strategy: str = "wait_then_fail", **kw) -> ManagerSpec:
    contention = ContentionSpec(
        strategy=strategy,
        wait_timeout_s=kw.pop("wait_timeout_s", 30.0),
        preempt_after_s=kw.pop("preempt_after_s", 0.0),
    )
    return ManagerSpec(memory_budget_bytes=int(budget_gb * GB), contention=contention, **kw)


@dataclass
class Sim:
    core: ResidencyCore
    now: float = 1000.0
    log: list[Action] = field(default_factory=list)
    # request id -> (model, instance) for granted leases
    leases: dict[int, tuple[str, int]] = field(default_factory=dict)
    rejected: dict[int, Exception] = field(default_factory=dict)
    # admin loads that completed (they hold no lease)
    loaded_for_admin: set[int] = field(default_factory=set)
    # request id -> slots its granted lease holds
    slots: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, mgr: ManagerSpec, *specs: ModelSpec) -> Sim:
        return cls(ResidencyCore.from_specs(mgr, specs))

    def _record(self, actions: list[Action]) -> list[Action]:
        for a in actions:
            if isinstance(a, Grant) and a.takes_lease:
                self.leases[a.request_id] = (a.model, a.instance)
                self.slots[a.request_id] = a.slots
            elif isinstance(a, Grant):
                self.loaded_for_admin.add(a.request_id)
            elif isinstance(a, Reject):
                self.rejected[a.request_id] = a.error
        self.log.extend(actions)
        return actions

    # events
    def request(self, model: str, slots: int = 1, priority: str = "default") -> int:
        rid = self.core.new_request_id()
        self._record(self.core.request(rid, model, self.now, slots=slots, priority=priority))
        return rid

    def cancel(self, rid: int) -> list[Action]:
        return self._record(self.core.cancel(rid, self.now))

    def release(self, rid: int) -> list[Action]:
        model, instance = self.leases.pop(rid)
        return self._record(self.core.release(model, instance, self.now, slots=self.slots.pop(rid), request_id=rid))

    def preemptable(self, rid: int, allowed: bool = True) -> list[Action]:
        return self._record(self.core.preemptable(rid, allowed, self.now))

    def requeue(self, rid: int) -> list[Action]:
        """The preempted request ``rid`` gives its lease back and waits again."""
        self.leases.pop(rid)
        self.slots.pop(rid)
        return self._record(self.core.requeue(rid, self.now))

    def preempted(self) -> list[int]:
        return [a.request_id for a in self.log if isinstance(a, PreemptLease)]

    def finish_load(self, model: str, error: str | None = None, measured_gb: float | None = None) -> list[Action]:
        inst = self.core.residents[model].instance
        measured = int(measured_gb * GB) if measured_gb is not None else None
        return self._record(
            self.core.load_finished(model, inst, self.now, error=error, measured_bytes=measured)
        )

    def finish_unload(self, model: str) -> list[Action]:
        inst = self.core.residents[model].instance
        return self._record(self.core.unload_finished(model, inst, self.now))

    def advance(self, seconds: float) -> list[Action]:
        self.now += seconds
        return self._record(self.core.tick(self.now))

    def call(self, method: str, *args, **kw) -> list[Action]:
        return self._record(getattr(self.core, method)(*args, **kw))

    # queries
    def state(self, model: str) -> State:
        return self.core.residents[model].state

    def loads(self, model: str | None = None) -> list[StartLoad]:
        return [a for a in self.log if isinstance(a, StartLoad) and (model is None or a.model == model)]

    def unloads(self, model: str | None = None) -> list[StartUnload]:
        return [a for a in self.log if isinstance(a, StartUnload) and (model is None or a.model == model)]

    def aborts(self) -> list[AbortGenerations]:
        return [a for a in self.log if isinstance(a, AbortGenerations)]

    def granted(self, rid: int) -> bool:
        return rid in self.leases

    def ready(self, model: str) -> None:
        """Load ``model`` to completion on behalf of one request and release it."""
        rid = self.request(model)
        if self.state(model) is State.LOADING:
            self.finish_load(model)
        assert self.granted(rid), f"{model} was not granted"
        self.release(rid)


def with_idle(s: ModelSpec, seconds: float) -> ModelSpec:
    return replace(s, idle_unload_seconds=seconds)
