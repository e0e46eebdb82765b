"""The async shell with fake engines and a fake clock: the same decisions as
the core, now with real tasks, futures, cancellation and timeouts."""

import asyncio
import logging
import dataclasses
from pathlib import Path

import pytest
from support.residency_sim import GB, manager, spec

from mlxd.errors import CapacityUnavailable, ModelLoadFailed, ModelNotFound, RequestTimeout
from mlxd.registry.model import Registry, ServerSpec
from mlxd.residency.shell import ResidencyManager
from support.idle_lifecycle import IdleLifecycle

pytestmark = pytest.mark.anyio


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeEngine(IdleLifecycle):
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = 0
        self.aborted: list[str] = []
        self.abort_event = asyncio.Event()
        self.measured_bytes = None

    async def abort_all(self, reason: str) -> int:
        self.aborted.append(reason)
        self.abort_event.set()
        return 1

    async def close(self) -> None:
        self.closed += 1


class Factory:
    def __init__(self) -> None:
        self.built: list[FakeEngine] = []
        self.gate: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()

    async def __call__(self, s, registry):
        gate = self.gate.get(s.name)
        if gate is not None:
            await gate.wait()
        if s.name in self.fail:
            raise OSError(f"cannot read {s.path}/config.json\nTraceback: secret internals")
        engine = FakeEngine(s.name)
        self.built.append(engine)
        return engine


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def before_unload(self, spec, engine, reason, registry):
        self.calls.append((spec.name, reason))


def make(budget_gb, *specs, strategy="wait_then_fail", **kw):
    registry = Registry(
        source_path=Path("/tmp/models.yaml"),
        file_hash="x",
        manager=manager(budget_gb, strategy, **kw),
        server=ServerSpec(),
        models=tuple(specs),
    )
    factory, clock, hooks = Factory(), FakeClock(), Hooks()
    mgr = ResidencyManager(registry, factory, clock=clock, hooks=hooks, auto_tick=False)
    return mgr, factory, clock, hooks


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_concurrent_first_requests_share_one_load():
    mgr, factory, _, _ = make(8, spec("a", 1, max_concurrency=5))
    factory.gate["a"] = asyncio.Event()
    tasks = [asyncio.create_task(mgr.acquire("a")) for _ in range(5)]
    await settle()
    factory.gate["a"].set()
    leases = await asyncio.gather(*tasks)
    assert len(factory.built) == 1
    assert {id(lease.engine) for lease in leases} == {id(factory.built[0])}
    for lease in leases:
        lease.release()
        lease.release()  # a second release is a no-op
    assert mgr.core.residents["a"].active == 0


async def test_alias_resolves_and_unknown_name_is_404():
    mgr, _, _, _ = make(8, spec("a", 1, aliases=("alpha",)))
    async with mgr.lease("alpha") as lease:
        assert lease.model == "a"
    with pytest.raises(ModelNotFound):
        await mgr.acquire("nope")


async def test_cancelled_waiter_during_cold_load_leaves_model_loaded_and_idle():
    mgr, factory, _, _ = make(8, spec("a", 1))
    factory.gate["a"] = asyncio.Event()
    waiter = asyncio.create_task(mgr.acquire("a"))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    factory.gate["a"].set()
    await mgr.quiesce()
    r = mgr.core.residents["a"]
    assert r.state.value == "loaded" and r.active == 0 and not mgr.core.waiters


async def test_timeout_waiting_for_capacity_is_504_and_leaks_nothing():
    mgr, _, _, _ = make(4, spec("a", 3), spec("b", 3), strategy="wait")
    held = await mgr.acquire("a")
    with pytest.raises(RequestTimeout) as info:
        await mgr.acquire("b", timeout=0.05)
    assert info.value.status_code == 504
    assert not mgr.core.waiters and mgr.core.residents["b"].state.value == "unloaded"
    held.release()


async def test_failed_load_gives_503_with_a_sanitized_reason():
    mgr, factory, _, _ = make(4, spec("a", 1))
    factory.fail.add("a")
    with pytest.raises(ModelLoadFailed) as info:
        await mgr.acquire("a")
    err = info.value
    assert err.status_code == 503 and err.retry_after
    assert "OSError: cannot read" in err.message and "Traceback" not in err.message
    assert mgr.core.residents["a"].state.value == "failed"


async def test_fail_policy_under_pressure_is_503_not_500():
    mgr, _, _, _ = make(4, spec("a", 3), spec("b", 3), strategy="fail")
    held = await mgr.acquire("a")
    with pytest.raises(CapacityUnavailable) as info:
        await mgr.acquire("b")
    assert info.value.status_code == 503
    held.release()


async def test_preemption_aborts_the_holder_and_serves_the_newcomer():
    mgr, factory, _, hooks = make(4, spec("a", 3), spec("b", 3), strategy="preempt")
    held = await mgr.acquire("a")
    victim = factory.built[0]
    newcomer = asyncio.create_task(mgr.acquire("b"))
    await asyncio.wait_for(victim.abort_event.wait(), 1)
    assert victim.aborted and "preempted for b" in victim.aborted[0]
    held.release()  # the aborted stream ends and gives its lease back
    lease = await asyncio.wait_for(newcomer, 1)
    assert lease.engine.name == "b" and victim.closed == 1
    assert hooks.calls[0][0] == "a"
    lease.release()


async def test_idle_unload_saves_then_closes_on_the_fake_clock():
    mgr, factory, clock, hooks = make(4, spec("a", 1, idle_unload_seconds=30))
    async with mgr.lease("a"):
        clock.now += 100
    clock.now += 29
    mgr.tick()
    await mgr.quiesce()
    assert factory.built[0].closed == 0
    clock.now += 1
    mgr.tick()
    await mgr.quiesce()
    assert factory.built[0].closed == 1 and hooks.calls == [("a", "idle for 30 s (idle_unload_seconds=30)")]
    assert mgr.core.residents["a"].state.value == "unloaded"


async def test_shutdown_waits_for_leases_then_aborts_the_rest_and_unloads_everything():
    mgr, factory, _, hooks = make(4, spec("a", 1), spec("b", 1))
    held = await mgr.acquire("a")
    async with mgr.lease("b"):
        pass
    engine_a = factory.built[0]

    async def stream_that_ends_on_abort():
        await engine_a.abort_event.wait()
        held.release()

    streamer = asyncio.create_task(stream_that_ends_on_abort())
    await mgr.shutdown(grace_seconds=0.05)
    await streamer
    assert engine_a.aborted == ["mlxd is shutting down"]
    assert all(e.closed == 1 for e in factory.built)
    assert sorted(name for name, _ in hooks.calls) == ["a", "b"]
    with pytest.raises(Exception) as info:
        await mgr.acquire("a")
    assert info.value.status_code == 503


async def test_measured_footprint_is_reported_for_remembering():
    remembered = {}
    registry = Registry(None, "x", manager(8), ServerSpec(), (spec("a", 1),))

    async def factory(s, registry):
        engine = FakeEngine(s.name)
        engine.measured_bytes = int(1.5 * GB)
        return engine

    mgr = ResidencyManager(registry, factory, auto_tick=False, on_measured=lambda s, n: remembered.update({s.name: n}))
    async with mgr.lease("a"):
        pass
    assert remembered == {"a": int(1.5 * GB)}
    assert mgr.core.residents["a"].charge() == int(1.5 * GB)


def _registry(*specs, budget_gb=8):
    return Registry(Path("/tmp/models.yaml"), "y", manager(budget_gb), ServerSpec(), tuple(specs))


async def test_lease_held_across_a_rename_is_released_under_the_new_name():
    mgr, factory, _, _ = make(8, spec("old", 1))
    held = await mgr.acquire("old")
    renamed = dataclasses.replace(spec("old", 1), name="new")
    await mgr.reconfigure(_registry(renamed), {"old": "new"})
    assert held.model == "new"
    held.release()
    r = mgr.core.residents["new"]
    assert r.active == 0 and r.state.value == "loaded" and len(factory.built) == 1
    assert mgr.engine("new") is factory.built[0]


async def test_a_rename_keeps_the_request_count_and_a_removed_model_is_forgotten():
    mgr, factory, _, _ = make(8, spec("old", 1), spec("gone", 1))
    for name in ("old", "old", "gone"):
        async with mgr.lease(name):
            pass
    renamed = dataclasses.replace(spec("old", 1), name="new")
    await mgr.reconfigure(_registry(renamed), {"old": "new"})
    await mgr.quiesce()
    assert mgr.stats["new"].requests == 2 and "old" not in mgr.stats
    assert "gone" not in mgr.stats and mgr.engine("gone") is None
    assert factory.built[1].closed == 1, "the removed model's engine was closed"
    async with mgr.lease("new") as lease:
        assert lease.engine is factory.built[0]
    assert mgr.stats["new"].requests == 3


async def test_a_rename_onto_a_name_still_draining_replaces_instead():
    mgr, factory, _, _ = make(8, spec("a", 1), spec("b", 1))
    held_b = await mgr.acquire("b")
    async with mgr.lease("a"):
        pass
    await mgr.reconfigure(_registry(spec("a", 1)))  # b is removed, draining
    assert mgr.renamable({"a": "b"}) == {}, "b's engine is still in memory under that name"
    held_b.release()


async def test_lease_granted_just_before_a_rename_resumes_under_the_new_name():
    mgr, factory, _, _ = make(8, spec("old", 1))
    factory.gate["old"] = asyncio.Event()
    waiter = asyncio.create_task(mgr.acquire("old"))
    await settle()
    factory.gate["old"].set()
    while mgr.core.residents["old"].active == 0:
        await asyncio.sleep(0)
    assert not waiter.done(), "the rename must land between the grant and the waiter resuming"
    renamed = dataclasses.replace(spec("old", 1), name="new")
    await mgr.reconfigure(_registry(renamed), {"old": "new"})
    lease = await waiter
    assert lease.model == "new" and lease.engine is factory.built[0]
    lease.release()
    assert mgr.core.residents["new"].active == 0


async def test_unload_after_a_reload_change_shows_hooks_the_engine_own_spec():
    a = spec("a", 1)
    mgr, factory, _, hooks = make(8, a)
    seen = []
    hooks.before_unload = lambda s, engine, reason, registry: _record(seen, s)
    async with mgr.lease("a"):
        pass
    moved = dataclasses.replace(a, path=Path("/models/a-q4"), source="/models/a-q4")
    await mgr.reconfigure(_registry(moved))
    await mgr.quiesce()
    assert [s.path for s in seen] == [Path("/models/a")], "the old engine's cache is saved under its own identity"
    assert len(factory.built) == 2, "the model was in memory, so it is loaded again"
    assert mgr.core.residents["a"].state.value == "loaded"


async def _record(seen, s):
    seen.append(s)


async def test_added_preload_model_loads_in_the_background():
    mgr, factory, _, _ = make(8, spec("a", 1))
    factory.gate["b"] = asyncio.Event()
    warm = await mgr.reconfigure(_registry(spec("a", 1), spec("b", 1, preload=True)))
    assert warm == ["b"]
    await settle()
    assert mgr.core.residents["b"].state.value == "loading", "reconfigure returned before the load finished"
    factory.gate["b"].set()
    await mgr.quiesce()
    assert mgr.core.residents["b"].state.value == "loaded"
    assert mgr.core.residents["a"].state.value == "unloaded"


async def test_a_measurement_refined_during_use_is_charged_and_remembered():
    remembered = {}
    registry = Registry(None, "x", manager(8), ServerSpec(), (spec("a", 1),))
    engines = []

    async def factory(s, registry):
        engine = FakeEngine(s.name)
        engine.measured_bytes = int(0.5 * GB)
        engines.append(engine)
        return engine

    mgr = ResidencyManager(registry, factory, auto_tick=False, on_measured=lambda s, n: remembered.update({s.name: n}))
    async with mgr.lease("a"):
        engines[0].measured_bytes = int(1.5 * GB)  # the first generation's peak
    assert remembered == {"a": int(1.5 * GB)}
    assert mgr.core.residents["a"].charge() == int(1.5 * GB)


async def test_remembered_footprints_are_charged_at_start_and_for_models_a_reload_adds():
    remembered = {"/models/a": int(3 * GB), "/models/b": int(2.5 * GB)}

    def recall(specs):
        return {s.name: remembered[str(s.path)] for s in specs if str(s.path) in remembered}

    registry = Registry(None, "x", manager(8), ServerSpec(), (spec("a", 1),))
    mgr = ResidencyManager(registry, Factory(), auto_tick=False, recall=recall)
    assert mgr.core.residents["a"].charge() == int(3 * GB)
    grown = Registry(None, "y", manager(8), ServerSpec(), (spec("a", 1), spec("b", 1)))
    await mgr.reconfigure(grown)
    assert mgr.core.residents["b"].charge() == int(2.5 * GB)


async def test_a_preload_the_stop_cut_short_is_logged_as_stopped_not_failed(caplog):
    mgr, factory, _, _ = make(4, spec("a", 1))
    factory.gate["a"] = asyncio.Event()
    preloading = asyncio.create_task(mgr.preload(["a"]))
    await settle()
    with caplog.at_level(logging.INFO, logger="mlxd.residency"):
        await mgr.shutdown(grace_seconds=0.05)
        await preloading
    assert "preload of a stopped: mlxd is shutting down" in caplog.text
    assert "preload of a failed" not in caplog.text
