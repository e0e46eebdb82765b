"""Priority classes in the fair queue, replayed on the residency core (no
clock, no I/O): which waiting request gets the next lease, and that every
class, bulk too, still gets its turn."""

from __future__ import annotations

from support.residency_sim import Sim, manager, spec

from mlxd.residency.priority import FairShare


def loaded(max_concurrency: int, reserve: bool = True, max_queue: int = 100) -> Sim:
    sim = Sim.of(manager(8), spec("m", 1, max_concurrency=max_concurrency, max_queue=max_queue))
    sim.core.fair.reserve_interactive = reserve
    sim.ready("m")
    return sim


def test_queued_bulk_work_yields_to_interactive_work_that_came_later():
    sim = loaded(1)
    running = sim.request("m", priority="bulk")
    bulk = [sim.request("m", priority="bulk") for _ in range(3)]
    editor = sim.request("m", priority="interactive")
    sim.release(running)
    assert sim.granted(editor) and not any(sim.granted(b) for b in bulk)
    sim.release(editor)
    # Then the bulk requests, in the order they came.
    assert sim.granted(bulk[0]) and not sim.granted(bulk[1])


def test_a_slot_per_model_is_kept_for_interactive_requests():
    sim = loaded(4)
    bulk = [sim.request("m", priority="bulk") for _ in range(6)]
    assert [sim.granted(b) for b in bulk] == [True, True, True, False, False, False]
    editor = sim.request("m", priority="interactive")
    assert sim.granted(editor), "the interactive request takes the kept slot at once"
    # A second interactive request waits like anyone (the slot is one).
    second = sim.request("m", priority="interactive")
    assert not sim.granted(second)
    sim.release(bulk[0])
    assert sim.granted(second) and not sim.granted(bulk[3])


def test_without_interactive_apps_no_slot_is_kept_and_the_queue_is_first_come_first_served():
    sim = loaded(2, reserve=False)
    first, second, third = (sim.request("m", priority=p) for p in ("bulk", "default", "interactive"))
    assert sim.granted(first) and sim.granted(second) and not sim.granted(third)
    plain = loaded(1, reserve=False)
    rids = [plain.request("m") for _ in range(4)]
    for i, rid in enumerate(rids):
        assert plain.granted(rid) and not any(plain.granted(r) for r in rids[i + 1:])
        plain.release(rid)


def test_bulk_is_not_starved_under_sustained_interactive_load():
    sim = loaded(1)
    order = []
    running = sim.request("m", priority="interactive")
    waiting = {sim.request("m", priority="bulk"): "bulk" for _ in range(5)}
    for _ in range(40):
        # Interactive work never stops arriving: one new request per turn.
        waiting[sim.request("m", priority="interactive")] = "interactive"
        sim.release(running)
        running = next(r for r in waiting if sim.granted(r))
        order.append(waiting.pop(running))
    # Weighted 8 : 1: bulk gets one lease in nine, and all five are served.
    assert order.count("bulk") == 4 and order[8] == "bulk" and order[:8] == ["interactive"] * 8
    while waiting:
        sim.release(running)
        running = next(r for r in waiting if sim.granted(r))
        order.append(waiting.pop(running))
    assert order.count("bulk") == 5


def test_admission_is_weighted_by_class():
    fair = FairShare()

    class W:
        def __init__(self, priority: str, arrived: float) -> None:
            self.priority, self.arrived, self.slots = priority, arrived, 1

    queue = [W(p, i) for i, p in enumerate(["bulk"] * 30 + ["default"] * 30 + ["interactive"] * 30)]
    picked = []
    for _ in range(26):
        w = fair.choose("m", queue, 0, 1)
        fair.served("m", w.priority)
        queue.remove(w)
        picked.append(w.priority)
    assert (picked.count("interactive"), picked.count("default"), picked.count("bulk")) == (16, 8, 2)


def test_a_request_of_several_slots_may_not_take_the_kept_one_and_holds_its_class_back():
    sim = loaded(4)
    first = sim.request("m", priority="bulk")
    wide = sim.request("m", slots=3, priority="bulk")
    later = sim.request("m", priority="bulk")
    # Three slots free, one of them kept: the 3-slot bulk request waits, and
    # the bulk request behind it does not jump it.
    assert sim.granted(first) and not sim.granted(wide) and not sim.granted(later)
    assert sim.granted(sim.request("m", priority="interactive"))


def test_a_class_that_was_idle_banks_no_credit():
    fair = FairShare()

    class W:
        def __init__(self, priority: str) -> None:
            self.priority, self.arrived, self.slots = priority, 0.0, 1

    # Only interactive work for a long while ...
    for _ in range(100):
        fair.served("m", fair.choose("m", [W("interactive")], 0, 1).priority)
    # ... then bulk arrives: it gets its share from now on, not a burst of 100/8.
    queue = [W("bulk") for _ in range(20)] + [W("interactive") for _ in range(20)]
    picked = []
    for _ in range(18):
        w = fair.choose("m", queue, 0, 1)
        fair.served("m", w.priority)
        queue.remove(w)
        picked.append(w.priority)
    assert picked.count("bulk") == 2


def test_a_request_that_needs_every_slot_runs_once_the_model_is_idle():
    sim = loaded(2)
    first = sim.request("m", priority="bulk")
    wide = sim.request("m", slots=2, priority="bulk")  # n = 2 on a model of two slots
    assert sim.granted(first) and not sim.granted(wide)
    sim.release(first)
    assert sim.granted(wide), "it could never fit beside the kept slot: the idle model lets it in"
    editor = sim.request("m", priority="interactive")
    assert not sim.granted(editor) and sim.preempted() == [], "it has not said it may be taken back"
    sim.preemptable(wide)
    assert sim.preempted() == [wide]
