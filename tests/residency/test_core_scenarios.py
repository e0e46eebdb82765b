"""The residency core, one named scenario per test, with a fake clock and no I/O."""

from dataclasses import replace

import pytest

from support.residency_sim import GB, Sim, manager, spec, with_idle

from mlxd.errors import CapacityUnavailable, ModelLoadFailed, ModelNotFound, QueueFull, ShuttingDown
from mlxd.residency.core import State


def test_concurrent_first_requests_start_exactly_one_load():
    sim = Sim.of(manager(8), spec("a", 2, max_concurrency=4))
    rids = [sim.request("a") for _ in range(3)]
    assert len(sim.loads("a")) == 1
    assert sim.state("a") is State.LOADING
    sim.finish_load("a")
    assert all(sim.granted(r) for r in rids)
    instances = {sim.leases[r][1] for r in rids}
    assert instances == {1}, "all waiters are served by the one engine that loaded"


def test_leases_beyond_max_concurrency_wait_for_a_release():
    sim = Sim.of(manager(8), spec("a", 2, max_concurrency=1))
    first, second = sim.request("a"), sim.request("a")
    sim.finish_load("a")
    assert sim.granted(first) and not sim.granted(second)
    sim.release(first)
    assert sim.granted(second)


def test_idle_models_are_evicted_least_recently_used_first():
    sim = Sim.of(manager(4), spec("a", 2), spec("b", 2), spec("c", 2))
    sim.ready("a")
    sim.now += 10
    sim.ready("b")
    sim.now += 10
    sim.ready("a")  # a is now the most recently used
    sim.request("c")
    assert [u.model for u in sim.unloads()] == ["b"]
    assert "least recently used" in sim.unloads()[0].reason
    assert sim.unloads()[0].evicted
    sim.finish_unload("b")
    assert sim.loads("c")


def test_pinned_model_is_never_evicted():
    sim = Sim.of(manager(4), spec("pin", 2, pinned=True), spec("b", 2), spec("c", 2))
    sim.ready("pin")
    sim.now += 10
    sim.ready("b")
    sim.request("c")
    assert [u.model for u in sim.unloads()] == ["b"]


def test_pinned_model_is_never_idle_unloaded():
    sim = Sim.of(manager(4), spec("pin", 2, pinned=True, idle_unload_seconds=5))
    sim.ready("pin")
    sim.advance(3600)
    assert sim.state("pin") is State.LOADED
    assert sim.core.next_deadline() is None


def test_idle_clock_starts_at_last_release_not_at_request():
    sim = Sim.of(manager(4), with_idle(spec("a", 1, max_concurrency=2), 60))
    r1 = sim.request("a")
    sim.finish_load("a")
    sim.advance(100)  # a long generation: the lease is held throughout
    assert sim.state("a") is State.LOADED
    sim.release(r1)
    assert sim.core.next_deadline() == sim.now + 60
    sim.advance(59)
    assert sim.state("a") is State.LOADED
    sim.advance(1)
    assert sim.state("a") is State.UNLOADING
    assert "idle for 60 s" in sim.unloads("a")[0].reason
    assert not sim.unloads("a")[0].evicted


def test_client_disconnect_during_cold_load_leaves_a_clean_loaded_model():
    sim = Sim.of(manager(4), with_idle(spec("a", 2), 30))
    rid = sim.request("a")
    sim.cancel(rid)
    assert sim.state("a") is State.LOADING  # the load goes on
    sim.finish_load("a")
    r = sim.core.residents["a"]
    assert r.state is State.LOADED and r.active == 0
    assert sim.core.committed() == 2 * GB
    sim.advance(30)
    sim.finish_unload("a")
    assert sim.core.committed() == 0 and sim.state("a") is State.UNLOADED


def test_request_arriving_while_its_model_unloads_reloads_it_after():
    sim = Sim.of(manager(4), with_idle(spec("a", 2), 10))
    sim.ready("a")
    sim.advance(10)
    assert sim.state("a") is State.UNLOADING
    rid = sim.request("a")
    assert not sim.granted(rid) and len(sim.loads("a")) == 1
    sim.finish_unload("a")
    assert len(sim.loads("a")) == 2 and sim.state("a") is State.LOADING
    sim.finish_load("a")
    assert sim.leases[rid] == ("a", 2)


def test_model_larger_than_the_budget_fails_without_evicting_anything():
    sim = Sim.of(manager(4), spec("a", 2), spec("huge", 6))
    sim.ready("a")
    rid = sim.request("huge")
    err = sim.rejected[rid]
    assert isinstance(err, CapacityUnavailable) and err.code == "model_too_large"
    assert sim.unloads() == [] and sim.state("a") is State.LOADED


def test_eviction_is_all_or_nothing():
    sim = Sim.of(manager(10, "wait_then_fail"), spec("a", 3), spec("b", 5), spec("c", 6))
    sim.ready("a")
    busy = sim.request("b")
    sim.finish_load("b")
    assert sim.granted(busy)
    sim.request("c")  # needs 6: free 2 + idle a 3 = 5 < 6
    assert sim.unloads() == [], "evicting a alone would not make c fit"
    assert sim.state("a") is State.LOADED


def test_failed_load_is_retried_with_backoff_and_waiters_get_503():
    sim = Sim.of(manager(4, load_retry_backoff_s=5), spec("a", 1))
    r1, r2 = sim.request("a"), sim.request("a")
    sim.finish_load("a", error="config.json is not valid JSON")
    for r in (r1, r2):
        err = sim.rejected[r]
        assert isinstance(err, ModelLoadFailed) and err.status_code == 503
        assert err.retry_after == 5
    assert sim.state("a") is State.FAILED and sim.core.committed() == 0
    r3 = sim.request("a")
    assert isinstance(sim.rejected[r3], ModelLoadFailed), "no retry storm during the backoff"
    assert len(sim.loads("a")) == 1
    sim.advance(5)
    r4 = sim.request("a")
    assert len(sim.loads("a")) == 2
    sim.finish_load("a", error="still broken")
    assert sim.rejected[r4].retry_after == 10, "backoff doubles"


def test_a_load_error_that_ends_its_own_sentence_gets_no_second_stop():
    sim = Sim.of(manager(4, load_retry_backoff_s=5), spec("a", 1), spec("b", 1))
    first, second = sim.request("a"), sim.request("b")
    sim.finish_load("a", error="Tensor 'x' has a dimension that is too large. Perhaps a corrupt file?")
    sim.finish_load("b", error="Expected shape (4, 8) but received shape (4, 0).")
    assert str(sim.rejected[first]) == (
        "Model `a` failed to load: Tensor 'x' has a dimension that is too large. Perhaps a corrupt file? "
        "Retrying in 5 s.")
    assert str(sim.rejected[second]).startswith(
        "Model `b` failed to load: Expected shape (4, 8) but received shape (4, 0). Retrying in")


def test_admin_load_skips_the_backoff():
    sim = Sim.of(manager(4, load_retry_backoff_s=60), spec("a", 1))
    sim.request("a")
    sim.finish_load("a", error="boom")
    rid = sim.core.new_request_id()
    sim.call("admin_load", rid, "a", sim.now)
    assert len(sim.loads("a")) == 2
    sim.finish_load("a")
    assert rid in sim.loaded_for_admin and sim.core.residents["a"].active == 0


def test_capacity_wait_that_times_out_is_503_with_retry_after():
    sim = Sim.of(manager(4, "wait_then_fail", wait_timeout_s=20), spec("a", 3), spec("b", 3))
    busy = sim.request("a")
    sim.finish_load("a")
    rid = sim.request("b")
    assert rid not in sim.rejected
    assert sim.core.next_deadline() == sim.now + 20
    sim.advance(20)
    err = sim.rejected[rid]
    assert isinstance(err, CapacityUnavailable) and err.status_code == 503
    assert err.retry_after >= 1
    assert sim.granted(busy)
    assert "the rest held by `a` (1 request(s) in flight)." in err.message


def test_a_load_that_pinned_models_block_says_they_are_pinned_not_in_use():
    # Idle and pinned, they were called "in use": waiting and retrying cannot help, unpinning can.
    sim = Sim.of(manager(4, "fail"), spec("a", 3, pinned=True), spec("b", 3))
    sim.ready("a")
    err = sim.rejected[sim.request("b")]
    assert "the rest held by `a` (pinned); unpin or unload one" in err.message


def test_fail_policy_rejects_at_once():
    sim = Sim.of(manager(4, "fail"), spec("a", 3), spec("b", 3))
    sim.request("a")
    sim.finish_load("a")
    rid = sim.request("b")
    assert isinstance(sim.rejected[rid], CapacityUnavailable)
    assert sim.unloads() == []


def test_requests_for_a_resident_model_never_wait_behind_a_swap():
    sim = Sim.of(manager(4, "wait"), spec("a", 3, max_concurrency=4), spec("b", 3))
    first = sim.request("a")
    sim.finish_load("a")
    sim.request("b")  # blocked: a is busy
    later = sim.request("a")
    assert sim.granted(first) and sim.granted(later)


def test_preemption_aborts_the_victim_then_loads_without_a_second_copy():
    sim = Sim.of(manager(4, "preempt"), spec("a", 3), spec("b", 3))
    victim_lease = sim.request("a")
    sim.finish_load("a")
    wanted = sim.request("b")
    assert [a.model for a in sim.aborts()] == ["a"]
    assert sim.state("a") is State.DRAINING
    # A request for the model being preempted waits; it must not load a second copy.
    again = sim.request("a")
    assert len(sim.loads("a")) == 1 and not sim.granted(again)
    assert sim.core.committed() <= sim.core.budget
    sim.release(victim_lease)  # the aborted stream ends
    assert sim.state("a") is State.UNLOADING
    sim.finish_unload("a")
    assert sim.loads("b") and sim.core.committed() <= sim.core.budget
    sim.finish_load("b")
    assert sim.granted(wanted)


def test_wait_then_preempt_preempts_only_after_the_delay():
    sim = Sim.of(manager(4, "wait_then_preempt", preempt_after_s=15), spec("a", 3), spec("b", 3))
    sim.request("a")
    sim.finish_load("a")
    sim.request("b")
    sim.advance(14)
    assert sim.aborts() == []
    sim.advance(1)
    assert [a.model for a in sim.aborts()] == ["a"]


def test_pinned_models_are_never_preempted():
    sim = Sim.of(manager(4, "preempt"), spec("a", 3, pinned=True), spec("b", 3))
    sim.request("a")
    sim.finish_load("a")
    rid = sim.request("b")
    assert sim.aborts() == [] and rid not in sim.rejected


def test_waiting_requests_are_grouped_by_model_instead_of_swapping_per_request():
    sim = Sim.of(manager(3, "wait"), spec("a", 2, max_concurrency=8), spec("b", 2, max_concurrency=8), spec("c", 2, max_concurrency=8))
    order = ["a", "b", "a", "a", "c", "a", "b", "c"]
    rids = {i: sim.request(m) for i, m in enumerate(order)}
    served = set()
    for _ in range(10):
        loading = [m for m in "abc" if sim.state(m) is State.LOADING]
        for m in loading:
            sim.finish_load(m)
        for i, rid in rids.items():
            if sim.granted(rid) and i not in served:
                served.add(i)
                sim.release(rid)
        for m in "abc":
            if sim.state(m) is State.UNLOADING:
                sim.finish_unload(m)
        if len(served) == len(order):
            break
    assert len(served) == len(order)
    assert len(sim.loads()) == 3, [l.model for l in sim.loads()]


def test_a_request_passed_over_too_long_drains_the_busy_model():
    sim = Sim.of(manager(4, "wait", max_pass_over_s=10), spec("a", 3, max_concurrency=8), spec("b", 3))
    first = sim.request("a")
    sim.finish_load("a")
    assert sim.granted(first)
    sim.request("b")
    sim.advance(9)
    assert sim.state("a") is State.LOADED and sim.granted(sim.request("a"))
    sim.advance(1)
    assert sim.state("a") is State.DRAINING
    newcomer = sim.request("a")
    assert not sim.granted(newcomer), "the draining model admits nobody new"
    assert sim.aborts() == [], "fairness drains, it does not abort"


@pytest.mark.parametrize("loaded", [False, True])
def test_queue_beyond_max_queue_is_rejected_with_429_loaded_or_not(loaded):
    # max_concurrency requests run and max_queue wait, whether the model is in memory yet or not:
    # waiting for a load, the ones its slots will take counted as queued, and a cold model of
    # max_queue 0 refused every request.
    sim = Sim.of(manager(4), spec("a", 1, max_queue=2, max_concurrency=2))
    if loaded:
        sim.ready("a")
    admitted = [sim.request("a") for _ in range(4)]
    assert not [rid for rid in admitted if rid in sim.rejected]
    rid = sim.request("a")
    err = sim.rejected[rid]
    assert isinstance(err, QueueFull) and err.status_code == 429 and err.retry_after


def test_a_cold_model_without_a_queue_is_loaded_for_its_first_request():
    sim = Sim.of(manager(4), spec("a", 1, max_queue=0))
    first = sim.request("a")
    assert first not in sim.rejected and sim.state("a") is State.LOADING
    assert isinstance(sim.rejected[sim.request("a")], QueueFull)
    sim.finish_load("a")
    assert sim.granted(first)


def test_unknown_model_is_404():
    sim = Sim.of(manager(4), spec("a", 1, aliases=("alpha",)))
    rid = sim.request("nope")
    err = sim.rejected[rid]
    assert isinstance(err, ModelNotFound) and "`a`, `alpha`" in err.message


def test_shutdown_rejects_waiters_and_unloads_after_leases_drain():
    sim = Sim.of(manager(4), spec("a", 1), spec("b", 1), spec("c", 3))
    held = sim.request("a")
    sim.finish_load("a")
    sim.ready("b")
    waiting = sim.request("c")
    sim.call("begin_shutdown", sim.now)
    assert isinstance(sim.rejected[waiting], ShuttingDown)
    assert sim.state("b") is State.UNLOADING and sim.state("a") is State.DRAINING
    late = sim.request("a")
    assert isinstance(sim.rejected[late], ShuttingDown)
    sim.release(held)
    assert sim.state("a") is State.UNLOADING


def test_measured_footprint_larger_than_estimate_is_used_for_the_next_admission():
    sim = Sim.of(manager(5), spec("a", 2), spec("b", 2))
    rid = sim.request("a")
    sim.finish_load("a", measured_gb=3.5)
    sim.release(rid)
    assert sim.core.committed() == int(3.5 * GB)
    sim.request("b")  # 2 + 3.5 > 5: a (idle) must make room
    assert [u.model for u in sim.unloads()] == ["a"]


def test_reconfigure_live_change_keeps_the_model_loaded():
    a = with_idle(spec("a", 1), 60)
    sim = Sim.of(manager(4), a)
    sim.ready("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, idle_unload_seconds=5, pinned=False)], sim.now)
    assert sim.state("a") is State.LOADED and sim.unloads() == []
    sim.advance(5)
    assert sim.state("a") is State.UNLOADING


def test_a_raised_memory_estimate_applies_to_the_loaded_model_at_once():
    # estimated_memory_gb is a live change: the model stays, its charge moves.
    a = spec("a", 1)
    sim = Sim.of(manager(4), a, spec("c", 2))
    sim.ready("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, memory_override_bytes=3 * GB), spec("c", 2)], sim.now)
    assert sim.state("a") is State.LOADED and sim.core.residents["a"].reserved == 3 * GB
    sim.request("c")  # 3 + 2 > 4: a must make room, as it would had it loaded at 3 GB
    assert [u.model for u in sim.unloads()] == ["a"]


def test_a_raised_estimate_over_the_budget_evicts_idle_models_at_once():
    a, b = spec("a", 1), spec("b", 2)
    sim = Sim.of(manager(4), a, b)
    sim.ready("b")
    sim.now += 1
    sim.ready("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, memory_override_bytes=3 * GB), b], sim.now)
    assert [u.model for u in sim.unloads()] == ["b"]


def test_a_lowered_estimate_frees_room_but_not_below_what_was_measured():
    a = spec("a", 3)
    sim = Sim.of(manager(4), a, spec("b", 2))
    sim.ready("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, memory_override_bytes=1 * GB), spec("b", 2)], sim.now)
    assert sim.core.residents["a"].reserved == 1 * GB
    sim.request("b")  # 1 + 2 fit: nothing is evicted
    assert sim.unloads() == [] and sim.state("a") is State.LOADED
    sim.finish_load("b", measured_gb=2.5)
    sim.call("reconfigure", sim.core.manager, [replace(a, memory_override_bytes=1 * GB),
                                               spec("b", 1)], sim.now)
    assert sim.core.residents["b"].reserved == int(2.5 * GB)


def test_reconfigure_path_change_finishes_in_flight_then_reloads():
    a = spec("a", 1)
    sim = Sim.of(manager(4), a)
    held = sim.request("a")
    sim.finish_load("a")
    moved = replace(a, path=a.path.with_name("a-v2"), source="/models/a-v2")
    sim.call("reconfigure", sim.core.manager, [moved], sim.now)
    assert sim.state("a") is State.DRAINING
    nxt = sim.request("a")
    assert not sim.granted(nxt)
    sim.release(held)
    sim.finish_unload("a")
    sim.finish_load("a")
    assert sim.leases[nxt] == ("a", 2)
    assert sim.core.residents["a"].spec.path.name == "a-v2"


def test_reconfigure_removal_rejects_waiters_and_unloads_after_drain():
    sim = Sim.of(manager(2), spec("a", 1), spec("b", 2))
    held = sim.request("a")
    sim.finish_load("a")
    waiting_b = sim.request("b")
    sim.call("reconfigure", sim.core.manager, [spec("a", 1)], sim.now)
    assert isinstance(sim.rejected[waiting_b], ModelNotFound)
    assert "b" not in sim.core.residents
    sim.call("reconfigure", sim.core.manager, [spec("z", 1)], sim.now)
    assert sim.state("a") is State.DRAINING
    sim.release(held)
    sim.finish_unload("a")
    assert "a" not in sim.core.residents and sim.core.committed() == 0


def test_reconfigure_rename_keeps_the_engine():
    old = spec("old", 1)
    sim = Sim.of(manager(4), old)
    sim.ready("old")
    sim.call("reconfigure", sim.core.manager, [replace(old, name="new")], sim.now, renames={"old": "new"})
    assert sim.state("new") is State.LOADED and sim.unloads() == []


def test_lowered_budget_evicts_idle_models_until_it_fits():
    sim = Sim.of(manager(6), spec("a", 2), spec("b", 2), spec("c", 2))
    for m in "abc":
        sim.ready(m)
        sim.now += 1
    sim.call("reconfigure", manager(4), list(r.spec for r in sim.core.residents.values()), sim.now)
    assert [u.model for u in sim.unloads()] == ["a"]


def test_reconfigure_reloads_a_resident_model_after_its_drain_without_a_request():
    a = spec("a", 1)
    sim = Sim.of(manager(4), a)
    held = sim.request("a")
    sim.finish_load("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, max_context=8192)], sim.now)
    assert sim.state("a") is State.DRAINING and len(sim.loads("a")) == 1
    sim.release(held)
    sim.finish_unload("a")
    assert [(x.model, x.instance) for x in sim.loads("a")] == [("a", 1), ("a", 2)]
    sim.finish_load("a")
    assert sim.state("a") is State.LOADED
    assert sim.core.residents["a"].spec.max_context == 8192


def test_reconfigure_does_not_warm_up_a_model_that_was_not_in_memory():
    a = spec("a", 1)
    sim = Sim.of(manager(4), a)
    sim.call("reconfigure", sim.core.manager, [replace(a, max_context=8192)], sim.now)
    assert sim.state("a") is State.UNLOADED and sim.loads() == []


def test_reload_warm_up_never_evicts_another_model():
    a, b = spec("a", 2), spec("b", 2)
    sim = Sim.of(manager(4), a, b)
    sim.ready("a")
    sim.ready("b")
    bigger = replace(a, max_context=8192, memory_override_bytes=3 * GB)
    sim.call("reconfigure", sim.core.manager, [bigger, b], sim.now)
    sim.finish_unload("a")
    assert sim.state("a") is State.UNLOADED and sim.state("b") is State.LOADED
    assert len(sim.loads("a")) == 1 and sim.unloads("b") == []


def test_two_reloads_during_one_drain_load_the_model_once_with_the_last_spec():
    a = spec("a", 1)
    sim = Sim.of(manager(4), a)
    held = sim.request("a")
    sim.finish_load("a")
    v2 = replace(a, path=a.path.with_name("a-v2"), source="/models/a-v2")
    v3 = replace(a, path=a.path.with_name("a-v3"), source="/models/a-v3")
    sim.call("reconfigure", sim.core.manager, [v2], sim.now)
    sim.call("reconfigure", sim.core.manager, [v3], sim.now)
    sim.release(held)
    sim.finish_unload("a")
    assert len(sim.loads("a")) == 2, "one initial load, one reload"
    sim.finish_load("a")
    assert sim.core.residents["a"].spec.path.name == "a-v3"


def test_model_removed_then_restored_before_its_drain_ends_stays_registered():
    a = spec("a", 1, max_concurrency=2)
    sim = Sim.of(manager(4), a, spec("b", 1))
    held = sim.request("a")
    sim.finish_load("a")
    sim.call("reconfigure", sim.core.manager, [spec("b", 1)], sim.now)
    assert sim.state("a") is State.DRAINING
    sim.call("reconfigure", sim.core.manager, [a, spec("b", 1)], sim.now)
    assert sim.state("a") is State.LOADED, "same files: the engine is kept"
    nxt = sim.request("a")
    assert sim.granted(nxt)
    sim.release(held)
    sim.release(nxt)
    assert "a" in sim.core.residents and sim.unloads("a") == []


def test_model_removed_while_loading_and_restored_ends_loaded():
    a = spec("a", 1)
    sim = Sim.of(manager(4), a)
    rid = sim.request("a")
    sim.call("reconfigure", sim.core.manager, [], sim.now)
    assert isinstance(sim.rejected[rid], ModelNotFound)
    sim.call("reconfigure", sim.core.manager, [a], sim.now)
    sim.finish_load("a")
    assert sim.state("a") is State.LOADED and sim.unloads() == []


def test_lowered_budget_with_every_model_busy_evicts_as_they_go_idle():
    sim = Sim.of(manager(4), spec("a", 2), spec("b", 2))
    held_a, held_b = sim.request("a"), sim.request("b")
    sim.finish_load("a")
    sim.finish_load("b")
    sim.call("reconfigure", manager(3), [spec("a", 2), spec("b", 2)], sim.now)
    assert sim.unloads() == [], "busy models are never unloaded"
    sim.release(held_a)
    assert [u.model for u in sim.unloads()] == ["a"]
    sim.finish_unload("a")
    sim.release(held_b)
    assert [u.model for u in sim.unloads()] == ["a"], "b alone fits the new budget"


def test_a_larger_measurement_after_the_first_generation_raises_the_charge():
    sim = Sim.of(manager(5), spec("a", 2), spec("b", 2))
    sim.ready("a")
    sim.call("measured", "a", 1, int(3.5 * GB), sim.now)
    assert sim.core.residents["a"].charge() == int(3.5 * GB)
    assert sim.core.committed() == int(3.5 * GB)
    sim.request("b")  # 3.5 + 2 > 5: the idle a makes room
    assert [u.model for u in sim.unloads()] == ["a"]


def test_a_pass_over_drain_is_called_off_when_its_waiters_time_out():
    # max_pass_over_s < wait_timeout_s: b's request drains a at 3 s and gives
    # up with 503 at 8 s; a must not then be unloaded for nobody.
    sim = Sim.of(
        manager(4, "wait_then_fail", wait_timeout_s=8, max_pass_over_s=3),
        spec("a", 3, max_concurrency=8),
        spec("b", 3),
    )
    busy = sim.request("a")
    sim.finish_load("a")
    wanted = sim.request("b")
    sim.advance(3)
    assert sim.state("a") is State.DRAINING
    queued = sim.request("a")
    assert not sim.granted(queued)
    sim.advance(5)
    assert isinstance(sim.rejected[wanted], CapacityUnavailable)
    assert sim.state("a") is State.LOADED and sim.core.residents["a"].drain_reason is None
    assert sim.granted(queued), "a serves its own queue again"
    sim.advance(3)
    sim.release(busy)
    sim.release(queued)
    assert sim.unloads() == [] and sim.state("a") is State.LOADED


def _a_drained_for_b():
    """a is busy; a request for b has waited past max_pass_over_s."""
    sim = Sim.of(manager(4, "wait", max_pass_over_s=3), spec("a", 3), spec("b", 3))
    busy = sim.request("a")
    sim.finish_load("a")
    wanted = sim.request("b")
    sim.advance(3)
    assert sim.state("a") is State.DRAINING
    return sim, busy, wanted


def test_a_pass_over_drain_is_called_off_when_its_waiter_disconnects():
    sim, busy, wanted = _a_drained_for_b()
    sim.cancel(wanted)
    sim.release(busy)
    assert sim.unloads() == [] and sim.state("a") is State.LOADED


def test_a_drain_still_wanted_by_a_waiter_goes_through():
    sim, busy, wanted = _a_drained_for_b()
    sim.release(busy)
    assert [u.model for u in sim.unloads()] == ["a"]
    sim.finish_unload("a")
    sim.finish_load("b")
    assert sim.granted(wanted)


def test_a_preempted_model_stays_loaded_when_the_preemptor_went_away():
    sim = Sim.of(manager(4, "preempt"), spec("a", 3), spec("b", 3))
    victim = sim.request("a")
    sim.finish_load("a")
    wanted = sim.request("b")
    assert [a.model for a in sim.aborts()] == ["a"]
    sim.cancel(wanted)
    sim.release(victim)  # the aborted stream ends
    assert sim.unloads() == [] and sim.state("a") is State.LOADED


def test_preemption_drains_every_model_it_needs_at_once():
    # free 1 + idle i 1 + y 2 = 4 < 5: y alone is not enough, x must go too.
    sim = Sim.of(manager(6, "preempt"), spec("i", 1), spec("x", 2), spec("y", 2), spec("b", 5))
    sim.ready("i")
    held_y = sim.request("y")
    sim.finish_load("y")
    sim.now += 1
    held_x = sim.request("x")
    sim.finish_load("x")
    sim.request("b")
    assert sorted(a.model for a in sim.aborts()) == ["x", "y"]
    assert sim.state("x") is State.DRAINING and sim.state("y") is State.DRAINING
    sim.release(held_x)
    sim.release(held_y)


def test_a_fairness_drain_stops_no_more_busy_models_than_needed():
    # b needs 4; idle i (2) plus the least recently used busy x (2) make room:
    # y keeps serving.
    sim = Sim.of(
        manager(6, "wait", max_pass_over_s=10), spec("i", 2), spec("x", 2), spec("y", 2), spec("b", 4)
    )
    sim.ready("i")
    sim.now += 1
    held_x = sim.request("x")
    sim.finish_load("x")
    sim.now += 1
    held_y = sim.request("y")
    sim.finish_load("y")
    wanted = sim.request("b")
    sim.advance(10)
    assert sim.state("x") is State.DRAINING and sim.state("y") is State.LOADED
    sim.release(held_x)
    sim.finish_unload("x")
    assert [u.model for u in sim.unloads()] == ["x", "i"], "the idle model goes once the plan is whole"
    sim.finish_unload("i")
    sim.finish_load("b")
    assert sim.granted(wanted) and sim.state("y") is State.LOADED
    sim.release(held_y)


def test_a_model_with_broken_files_is_failed_and_never_loaded_until_fixed():
    broken = spec("x", 1, broken="model.safetensors is not a valid safetensors file")
    sim = Sim.of(manager(8), spec("a", 1), broken)
    assert sim.state("x") is State.FAILED
    assert "safetensors" in sim.core.residents["x"].last_error
    rid = sim.request("x")
    assert isinstance(sim.rejected[rid], ModelLoadFailed) and "safetensors" in str(sim.rejected[rid])
    sim.advance(3600)
    assert not sim.loads("x") and sim.core.next_deadline() is None
    fixed = replace(broken, broken=None)
    sim.call("reconfigure", sim.core.manager, [spec("a", 1), fixed], sim.now)
    assert sim.state("x") is State.UNLOADED and sim.core.residents["x"].last_error is None
    sim.request("x")
    assert sim.loads("x")


def test_files_broken_under_a_loaded_model_drain_it_into_failed():
    a = spec("a", 1)
    sim = Sim.of(manager(8), a)
    sim.ready("a")
    rid = sim.request("a")
    sim.call("reconfigure", sim.core.manager, [replace(a, broken="config.json is not valid JSON")], sim.now)
    assert sim.state("a") is State.DRAINING
    sim.release(rid)
    sim.finish_unload("a")
    assert sim.state("a") is State.FAILED and len(sim.loads("a")) == 1


# --- n choices under one lease (#24 item 10) --------------------------------------


def test_a_request_of_n_choices_holds_n_slots_until_it_releases():
    sim = Sim.of(manager(8), spec("a", 2, max_concurrency=4))
    three = sim.request("a", slots=3)
    sim.finish_load("a")
    assert sim.granted(three) and sim.slots[three] == 3
    assert sim.core.occupancy("a") == (3, 0, 4)
    one, another = sim.request("a"), sim.request("a")
    assert sim.granted(one) and not sim.granted(another), "3 + 1 slots fill max_concurrency 4"
    sim.release(three)
    assert sim.granted(another)
    assert sim.core.occupancy("a") == (2, 0, 4)


def test_n_above_max_concurrency_is_charged_max_concurrency_and_still_granted():
    sim = Sim.of(manager(8), spec("a", 2, max_concurrency=2))
    many = sim.request("a", slots=16)
    sim.finish_load("a")
    assert sim.granted(many) and sim.slots[many] == 2
    single = sim.request("a")
    assert not sim.granted(single)
    sim.release(many)
    assert sim.granted(single)
    assert sim.core.occupancy("a") == (1, 0, 2)


def test_a_wide_request_is_not_starved_by_single_ones_arriving_after_it():
    sim = Sim.of(manager(8), spec("a", 2, max_concurrency=4))
    first = sim.request("a")
    sim.finish_load("a")
    wide = sim.request("a", slots=4)
    later = sim.request("a")
    assert not sim.granted(wide) and not sim.granted(later), "the later single one waits behind the wide one"
    sim.release(first)
    assert sim.granted(wide) and not sim.granted(later)
    sim.release(wide)
    assert sim.granted(later)


def test_slots_count_against_a_capacity_group_shared_max_concurrency():
    sim = Sim.of(manager(8), spec("x", 0, max_concurrency=3, capacity_group="b"),
                 spec("y", 0, max_concurrency=3, capacity_group="b"))
    two = sim.request("x", slots=2)
    sim.finish_load("x")
    sim.ready("y")
    pair = sim.request("y", slots=2)
    assert sim.granted(two) and not sim.granted(pair)
    sim.release(two)
    assert sim.granted(pair)
