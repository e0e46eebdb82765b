"""Random sequences of requests, releases, cancellations, failures and clock
advances against the residency core, checking its invariants after every step."""

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.residency_sim import Sim, manager, spec

from mlxd.residency.core import Grant, Note, Reject, StartLoad, StartUnload, State

MODELS = ["a", "b", "c", "d"]


class ResidencyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sim: Sim | None = None
        self.pending: list[int] = []  # requests neither granted nor rejected yet

    @precondition(lambda self: self.sim is None)
    @rule(
        strategy=st.sampled_from(["fail", "wait", "wait_then_fail", "preempt", "wait_then_preempt"]),
        sizes=st.lists(st.sampled_from([1, 2, 3, 5]), min_size=4, max_size=4),
        pinned=st.sampled_from([None, "a", "b"]),
        concurrency=st.integers(1, 3),
    )
    def configure(self, strategy, sizes, pinned, concurrency):
        specs = [
            spec(
                m,
                gb,
                pinned=(m == pinned),
                idle_unload_seconds=20.0,
                max_concurrency=concurrency,
                max_queue=6,
            )
            for m, gb in zip(MODELS, sizes)
        ]
        self.sim = Sim.of(
            manager(6, strategy, wait_timeout_s=15, preempt_after_s=5, max_pass_over_s=12, load_retry_backoff_s=3),
            *specs,
        )

    def _ready(self) -> bool:
        return self.sim is not None

    @precondition(_ready)
    @rule(model=st.sampled_from(MODELS + ["ghost"]))
    def request(self, model):
        self.pending.append(self.sim.request(model))

    @precondition(lambda self: self._ready() and self.sim.leases)
    @rule(data=st.data())
    def release(self, data):
        rid = data.draw(st.sampled_from(sorted(self.sim.leases)))
        self.sim.release(rid)

    @precondition(lambda self: self._ready() and self._waiting())
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(self._waiting()))
        self.sim.cancel(rid)
        self.pending.remove(rid)

    @precondition(lambda self: self._ready() and self._in("loading"))
    @rule(data=st.data(), fail=st.booleans())
    def finish_load(self, data, fail):
        model = data.draw(st.sampled_from(self._in("loading")))
        self.sim.finish_load(model, error="boom" if fail else None)

    @precondition(lambda self: self._ready() and self._in("unloading"))
    @rule(data=st.data())
    def finish_unload(self, data):
        self.sim.finish_unload(data.draw(st.sampled_from(self._in("unloading"))))

    @precondition(_ready)
    @rule(seconds=st.sampled_from([0.5, 3, 6, 13, 25]))
    def advance(self, seconds):
        self.sim.advance(seconds)

    @precondition(_ready)
    @rule(model=st.sampled_from(MODELS))
    def admin_unload(self, model):
        if model in self.sim.core.residents:
            self.sim.call("admin_unload", model, self.sim.now)

    # --- helpers ---
    def _in(self, state: str) -> list[str]:
        return sorted(n for n, r in self.sim.core.residents.items() if r.state.value == state)

    def _waiting(self) -> list[int]:
        waiting = {w.request_id for w in self.sim.core.waiters}
        return [r for r in self.pending if r in waiting]

    # --- invariants ---
    @invariant()
    def committed_never_exceeds_budget(self):
        if self.sim:
            assert self.sim.core.committed() <= self.sim.core.budget

    @invariant()
    def leases_match_active_counts_and_live_instances(self):
        if not self.sim:
            return
        for name, r in self.sim.core.residents.items():
            held = [inst for (m, inst) in self.sim.leases.values() if m == name]
            assert r.active == len(held), (name, r.active, held)
            assert all(inst == r.instance for inst in held)
            if r.active:
                assert r.state in (State.LOADED, State.DRAINING), (name, r.state)
            if r.state in (State.UNLOADED, State.FAILED):
                assert r.reserved == 0

    @invariant()
    def one_instance_per_model(self):
        if not self.sim:
            return
        live: dict[str, int] = {}
        for a in self.sim.log:
            if isinstance(a, StartLoad):
                assert live.get(a.model, 0) == 0, f"second copy of {a.model}"
                live[a.model] = 1
            elif isinstance(a, StartUnload) or (isinstance(a, Note) and a.kind == "failure"):
                live[a.model] = 0  # an unload or a failed load frees the slot

    @invariant()
    def every_request_is_answered_at_most_once(self):
        if not self.sim:
            return
        answers: dict[int, int] = {}
        for a in self.sim.log:
            if isinstance(a, (Grant, Reject)):
                answers[a.request_id] = answers.get(a.request_id, 0) + 1
        assert all(n == 1 for n in answers.values())

    @invariant()
    def a_model_drains_for_another_only_while_someone_waits_for_it(self):
        if not self.sim:
            return
        waited_for = {w.model for w in self.sim.core.waiters}
        for name, r in self.sim.core.residents.items():
            if r.drain and r.drain.for_model is not None:
                assert r.drain.for_model in waited_for, (name, r.drain)

    def teardown(self):
        """Quiescence: release everything, finish every transition, let time
        pass: nothing is stuck and no bytes stay reserved for nothing."""
        if not self.sim:
            return
        sim = self.sim
        for _ in range(60):
            for rid in sorted(sim.leases):
                sim.release(rid)
            for m in self._in("loading"):
                sim.finish_load(m)
            for m in self._in("unloading"):
                sim.finish_unload(m)
            sim.advance(25)
        assert not self._in("loading") and not self._in("unloading") and not self._in("draining")
        loaded = sum(r.reserved for r in sim.core.residents.values() if r.state is State.LOADED)
        assert sim.core.committed() == loaded
        pinned_bytes = sum(
            r.reserved for r in sim.core.residents.values() if r.spec.pinned and r.state is State.LOADED
        )
        for w in sim.core.waiters:
            need = sim.core.residents[w.model].charge()
            assert need + pinned_bytes > sim.core.budget, f"request for {w.model} stuck"


ResidencyMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("MLXD_PROPERTY_EXAMPLES", "200")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestResidencyProperties = ResidencyMachine.TestCase
