"""The slow-turn log's decision: a turn well past the recent median, with
where its time went, and nothing for ordinary turns."""

from mlxd.engine.turn_clock import TurnClock


def run_turn(clock: TurnClock, at: float, phases: dict[str, float], **counts: int) -> str | None:
    clock.start(at)
    for name, seconds in phases.items():
        at += seconds
        clock.mark(name, at)
    return clock.end(at, **counts)


def usual_turns(clock: TurnClock, n: int = 8) -> float:
    at = 0.0
    for _ in range(n):
        assert run_turn(clock, at, {"admit": 0.001, "step": 0.009}, rows=4) is None
        at += 1
    return at


def test_a_turn_past_twice_the_median_is_described_by_its_phases_and_counts():
    clock = TurnClock()
    at = usual_turns(clock)
    slow = run_turn(clock, at, {"admit": 0.001, "prefill and join": 0.024, "step": 0.010},
                    rows=4, joined=1, ended=0)
    assert slow == "slow turn 35.0 ms (usual 10.0): admit 1.0, prefill and join 24.0, step 10.0; rows 4, joined 1"


def test_ordinary_and_tiny_turns_are_not_reported():
    clock = TurnClock()
    at = usual_turns(clock)
    assert run_turn(clock, at, {"step": 0.015}, rows=4) is None  # 1.5x the median
    tiny = TurnClock()
    at = 0.0
    for _ in range(8):
        run_turn(tiny, at, {"step": 0.0002})
        at += 1
    assert run_turn(tiny, at, {"step": 0.002}) is None  # 10x, but under the floor


def test_no_verdict_before_there_is_a_median():
    clock = TurnClock()
    assert run_turn(clock, 0.0, {"step": 1.0}) is None


def test_given_the_threads_cpu_time_each_phase_says_how_much_of_it_was_work():
    clock = TurnClock()
    at = usual_turns(clock)
    clock.start(at, 100.0)
    clock.mark("admit", at + 0.001, 100.001)
    clock.mark("step", at + 0.051, 100.005)  # 50 ms, of which 4 ms of the thread's own work
    slow = clock.end(at + 0.051, rows=4, joined=1)
    assert slow == "slow turn 51.0 ms (usual 10.0): admit 1.0 (cpu 1.0), step 50.0 (cpu 4.0); rows 4, joined 1"
