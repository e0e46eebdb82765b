"""A resident engine that breaks under its leases (a parallel model's rank
died): the core takes it down whole, fails it with backoff, and loads it
again for the first request after the backoff. Fake clock, no I/O."""

from support.residency_sim import GB, Sim, manager, spec

from mlxd.errors import ModelLoadFailed
from mlxd.residency.core import State

WHY = "rank 1 was killed by SIGKILL"


def _broken_with_a_lease() -> tuple[Sim, int]:
    sim = Sim.of(manager(8, load_retry_backoff_s=5), spec("gang", 2), spec("other", 2))
    rid = sim.request("gang")
    sim.finish_load("gang")
    assert sim.granted(rid)
    instance = sim.core.residents["gang"].instance
    sim.call("engine_failed", "gang", instance, WHY, sim.now)
    return sim, rid


def test_a_broken_engine_admits_nothing_and_unloads_when_its_requests_end():
    sim, rid = _broken_with_a_lease()
    assert [a.reason for a in sim.aborts()] == [WHY]
    assert sim.state("gang") is State.DRAINING
    waiting = sim.request("gang")
    assert not sim.granted(waiting)
    sim.release(rid)
    assert [u.model for u in sim.unloads()] == ["gang"]
    sim.finish_unload("gang")
    r = sim.core.residents["gang"]
    assert r.state is State.FAILED and r.last_error == WHY and r.reserved == 0
    # The request that waited meanwhile is told why, and when to retry.
    error = sim.rejected[waiting]
    assert isinstance(error, ModelLoadFailed) and WHY in str(error) and "failed to load" not in str(error)
    assert sim.core.committed() == 0


def test_the_next_request_after_the_backoff_loads_a_fresh_engine():
    sim, rid = _broken_with_a_lease()
    sim.release(rid)
    sim.finish_unload("gang")
    early = sim.request("gang")
    assert isinstance(sim.rejected[early], ModelLoadFailed)
    sim.advance(5.1)
    later = sim.request("gang")
    assert len(sim.loads("gang")) == 2 and sim.state("gang") is State.LOADING
    sim.finish_load("gang")
    assert sim.granted(later) and sim.core.residents["gang"].instance == 2


def test_a_stale_report_from_an_earlier_instance_changes_nothing():
    sim, rid = _broken_with_a_lease()
    sim.release(rid)
    sim.finish_unload("gang")
    sim.advance(5.1)
    sim.ready("gang")
    before = list(sim.log)
    sim.call("engine_failed", "gang", 1, "an old gang's rank exited", sim.now)
    assert sim.log == before and sim.state("gang") is State.LOADED


def test_an_idle_broken_engine_unloads_at_once_and_frees_its_share_for_others():
    sim = Sim.of(manager(3), spec("gang", 2), spec("other", 2))
    sim.ready("gang")
    sim.call("engine_failed", "gang", 1, WHY, sim.now)
    assert [u.model for u in sim.unloads()] == ["gang"]
    sim.finish_unload("gang")
    rid = sim.request("other")
    sim.finish_load("other")
    assert sim.granted(rid) and sim.core.committed() == 2 * GB


def test_a_failure_event_ending_in_a_full_stop_reads_as_one_sentence():
    sim = Sim.of(manager(8, load_retry_backoff_s=5), spec("gang", 2))
    sim.request("gang")
    actions = sim.finish_load("gang", error="rank 1 exited.")
    (note,) = [a for a in actions if getattr(a, "kind", None) == "failure"]
    assert note.message == "load of gang failed: rank 1 exited; retry in 5 s"
