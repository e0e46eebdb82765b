"""Preemption before the first byte, replayed on the residency core: a bulk
lease that has sent nothing gives its slot to an interactive request and
waits again first of its class; one that has sent anything never does."""

from __future__ import annotations

from support.residency_sim import Sim, manager, spec


def loaded(max_concurrency: int = 1) -> Sim:
    sim = Sim.of(manager(8), spec("m", 1, max_concurrency=max_concurrency))
    sim.ready("m")
    return sim


def test_a_bulk_lease_that_has_sent_nothing_gives_its_slot_to_an_interactive_request():
    sim = loaded()
    bulk = sim.request("m", priority="bulk")
    sim.preemptable(bulk)
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == [bulk] and not sim.granted(editor)
    sim.requeue(bulk)
    assert sim.granted(editor) and not sim.granted(bulk)
    sim.release(editor)
    assert sim.granted(bulk), "the preempted request is served again once the slot is free"


def test_a_bulk_lease_that_sent_its_first_byte_is_never_preempted():
    sim = loaded()
    bulk = sim.request("m", priority="bulk")
    sim.preemptable(bulk)
    sim.preemptable(bulk, False)  # its first byte
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == []
    sim.release(bulk)
    assert sim.granted(editor)


def test_only_bulk_leases_give_way_and_only_to_interactive_requests():
    sim = loaded()
    chat = sim.request("m", priority="default")
    sim.preemptable(chat)
    sim.request("m", priority="interactive")
    assert sim.preempted() == []
    sim.release(chat)
    bulk = sim.request("m", priority="bulk")
    sim.log.clear()
    sim.preemptable(bulk)
    sim.request("m", priority="default")
    assert sim.preempted() == [], "a default request waits like any other"


def test_the_preempted_request_waits_first_of_its_class():
    sim = loaded()
    first = sim.request("m", priority="bulk")
    sim.preemptable(first)
    later = sim.request("m", priority="bulk")
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == [first]
    sim.requeue(first)
    sim.release(editor)
    assert sim.granted(first) and not sim.granted(later)


def test_one_lease_is_taken_back_per_interactive_waiter_and_the_latest_granted_goes_first():
    sim = loaded(max_concurrency=2)
    older, newer = sim.request("m", priority="bulk"), None
    sim.now += 1
    newer = sim.request("m", priority="bulk")
    sim.preemptable(older)
    sim.preemptable(newer)
    editor = sim.request("m", priority="interactive")
    sim.advance(1)
    assert sim.preempted() == [newer], "one waiter, one preemption, however often the core is asked"
    sim.requeue(newer)
    assert sim.granted(editor) and sim.granted(older)


def test_a_preempted_request_that_ends_first_lets_the_queue_go_on():
    sim = loaded()
    bulk = sim.request("m", priority="bulk")
    sim.preemptable(bulk)
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == [bulk]
    sim.release(bulk)  # it failed or was cancelled before it saw the preemption
    assert sim.granted(editor)


def test_a_lease_of_several_choices_is_taken_back_whole_and_waits_again_for_all_its_slots():
    sim = loaded(max_concurrency=3)
    sim.core.fair.reserve_interactive = False
    wide = sim.request("m", slots=3, priority="bulk")  # n = 3 under one lease
    sim.preemptable(wide)
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == [wide]
    sim.requeue(wide)
    assert sim.granted(editor) and not sim.granted(wide), "its three choices wait for three slots"
    sim.release(editor)
    assert sim.granted(wide) and sim.core.residents["m"].active == 3


def test_the_smallest_lease_that_frees_enough_slots_gives_way():
    sim = loaded(max_concurrency=4)
    sim.core.fair.reserve_interactive = False
    single = sim.request("m", priority="bulk")
    sim.now += 1
    wide = sim.request("m", slots=3, priority="bulk")  # granted last, but three choices would start over
    sim.preemptable(single)
    sim.preemptable(wide)
    editor = sim.request("m", priority="interactive")
    assert sim.preempted() == [single]
    sim.requeue(single)
    assert sim.granted(editor)
    pair = sim.request("m", slots=2, priority="interactive")
    assert sim.preempted() == [single, wide], "only the wide lease frees two slots"
    sim.requeue(wide)
    assert sim.granted(pair)
