"""The slow-turn log's decision: a turn well past the recent median, with
where its time went, and nothing for ordinary turns."""

from mlxd.engine.turn_clock import FirstTextClock, TurnClock


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


def first_text(clock: FirstTextClock, at: float, waited: float, first: float, detail: str = "") -> str | None:
    stamps = {"submitted": at, "admitted": at + waited, "prepared": at + waited + 0.001,
              "prefilled": at + waited + 0.001, "drawn": at + waited + 0.001 + first}
    stamps["out"] = stamps["drawn"]
    return clock.end(stamps, "interactive", detail)


def test_a_slow_first_text_says_whether_it_waited_for_a_turn_or_for_its_own_tokens():
    clock = FirstTextClock()
    for i in range(8):
        assert first_text(clock, i, 0.001, 0.003) is None  # 5 ms: the usual
    waited = first_text(clock, 10, 0.040, 0.003, "1 tokens, 55 cached, arrived during a turn of 41.0 ms")
    assert waited == ("slow first text 44.0 ms (usual 5.0), interactive: waited for the turn 40.0, admit 1.0, "
                      "first tokens 3.0; 1 tokens, 55 cached, arrived during a turn of 41.0 ms")
    own = first_text(clock, 11, 0.0002, 0.020)  # a wait under half a millisecond is left out
    assert own == "slow first text 21.2 ms (usual 5.0), interactive: admit 1.0, first tokens 20.0"
    assert first_text(clock, 12, 0.001, 0.006) is None  # 8 ms: under twice the usual
