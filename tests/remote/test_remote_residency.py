"""Remote entries in the residency core (fake clock, no I/O): they cost no
memory, share their backend's max_concurrency, and waiting for a busy
backend never holds up a local model."""

from pathlib import Path

from support.residency_sim import GB, Sim, manager, spec

from mlxd.registry.model import ModelSpec
from mlxd.residency.core import State


def remote(name: str, backend: str = "studio", capacity: int = 2) -> ModelSpec:
    return ModelSpec(name=name, path=Path(), source=f"{backend}:{name}", backend=backend,
                     remote_model=name, max_concurrency=capacity)


def test_remote_entries_load_without_memory_even_when_the_budget_is_full():
    sim = Sim.of(manager(2), spec("local", 2), remote("big"))
    sim.ready("local")
    rid = sim.request("big")
    assert sim.loads("big") and not sim.unloads()
    sim.finish_load("big")
    assert sim.granted(rid)
    assert sim.core.committed() == 2 * GB


def test_entries_of_one_backend_share_its_capacity():
    sim = Sim.of(manager(8), remote("a"), remote("b"), remote("other", backend="gpu"))
    for name in ("a", "b", "other"):
        sim.ready(name)
    first, second, third = sim.request("a"), sim.request("b"), sim.request("a")
    elsewhere = sim.request("other")
    assert sim.granted(first) and sim.granted(second)
    assert not sim.granted(third), "the backend's two slots are taken"
    assert sim.granted(elsewhere), "another backend has its own slots"
    assert sim.core.queued("a") == 1
    sim.release(second)
    assert sim.granted(third)


def test_a_busy_backend_never_holds_up_a_local_model():
    sim = Sim.of(manager(4), remote("big", capacity=1), spec("local", 2), spec("other", 2))
    sim.ready("big")
    holding, waiting = sim.request("big"), sim.request("big")
    assert sim.granted(holding) and not sim.granted(waiting)
    local = sim.request("local")
    assert sim.loads("local")
    sim.finish_load("local")
    assert sim.granted(local)
    sim.advance(3600)  # long past any pass-over bound: nothing drains for it
    assert not sim.unloads()
    assert sim.state("local") is State.LOADED


def test_a_remote_entry_is_never_evicted_to_make_room():
    sim = Sim.of(manager(2), remote("big"), spec("a", 2), spec("b", 2))
    sim.ready("big")
    sim.now += 10
    sim.ready("a")  # big is the least recently used, but holds nothing
    sim.request("b")
    assert [u.model for u in sim.unloads()] == ["a"]
