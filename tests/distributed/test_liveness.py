"""Liveness by progress, the pure core: made-up times, no processes."""

from mlxd.distributed.liveness import Deadlines, GangLiveness, Phase

DEADLINES = Deadlines(load_s=30, prefill_s=20, decode_step_s=5)


def _ready_gang(now: float = 0.0) -> GangLiveness:
    gang = GangLiveness.starting(["local", "local"], DEADLINES, now)
    for rank in (0, 1):
        gang.spawned(rank, 100 + rank, now)
        gang.progress(rank, Phase.LOADING, now)
    assert not gang.ready
    for rank in (0, 1):
        gang.progress(rank, Phase.READY, now + 1, memory_bytes=1000)
    assert gang.ready
    return gang


def test_only_a_gang_whose_every_rank_passed_the_barrier_is_ready():
    gang = GangLiveness.starting(["local", "local"], DEADLINES, 0)
    gang.progress(0, Phase.READY, 1)
    assert not gang.ready
    gang.progress(1, Phase.READY, 2)
    assert gang.ready


def test_a_slow_load_fails_at_the_load_deadline_naming_the_silent_rank():
    gang = GangLiveness.starting(["local", "local"], DEADLINES, 0)
    gang.progress(0, Phase.READY, 10)
    assert gang.check(29) is None
    failure = gang.check(31)
    assert failure is not None and failure.rank == 1 and "no load progress" in failure.reason


def test_an_idle_gang_owes_no_progress_however_long_it_waits():
    gang = _ready_gang()
    assert gang.check(10_000) is None and gang.next_deadline() is None


def test_work_sent_starts_the_prefill_clock_for_every_rank():
    gang = _ready_gang()
    gang.work_sent(100)
    assert gang.next_deadline() == 120
    assert gang.check(119) is None
    gang.progress(0, Phase.PREFILL, 110)
    failure = gang.check(121)
    assert failure is not None and failure.rank == 1 and "prefill" in failure.reason


def test_steady_decode_steps_keep_the_gang_alive_and_a_missing_step_fails_it():
    gang = _ready_gang()
    gang.work_sent(100)
    for t in range(101, 140):
        gang.progress(0, Phase.DECODE, t)
        gang.progress(1, Phase.DECODE, t)
        assert gang.check(t + 0.5) is None
    gang.progress(0, Phase.DECODE, 140)
    failure = gang.check(145.5)
    assert failure is not None and failure.rank == 1
    assert failure.sentence() == "rank 1 made no decode progress for 6.5 s (deadline 5 s)"


def test_a_stopped_rank_is_named_even_when_its_peer_fell_late_first():
    gang = _ready_gang()
    gang.work_sent(100)
    gang.progress(0, Phase.DECODE, 110.0)
    gang.progress(1, Phase.DECODE, 110.1)  # stopped right after this step
    failure = gang.check(115.05, os_stopped=frozenset({1}))
    assert failure is not None and failure.rank == 1 and "stopped (SIGSTOP)" in failure.reason


def test_the_first_failure_stands_and_later_exits_are_expected():
    gang = _ready_gang()
    first = gang.rank_failed(1, "was killed by SIGKILL")
    gang.stopped()
    assert gang.rank_failed(0, "was killed by SIGTERM") == first
    assert gang.expects_exit() and gang.check(1e9) == first
    rows = gang.rows(5.0)
    assert [(r["rank"], r["state"]) for r in rows] == [(0, "stopped"), (1, "failed")]


def test_work_done_clears_what_the_ranks_owe():
    gang = _ready_gang()
    gang.work_sent(100)
    gang.progress(0, Phase.DECODE, 101)
    gang.work_done(102)
    assert gang.check(10_000) is None
    rows = gang.rows(103.0)
    assert rows[0] == {"rank": 0, "host": "local", "pid": 100, "state": "ready", "memory_bytes": 1000,
                       "last_progress_s": 1.0}


def test_a_rank_that_lost_its_peer_is_named_only_if_no_peer_was_killed_meanwhile():
    gang = _ready_gang()
    gang.work_sent(100)
    gang.suspect(0, "failed while decode: [ring] connection to a peer was lost", 100.2)
    assert gang.check(100.5) is None and gang.next_deadline() == 101.2
    # The peer's death arrives late (over HTTP from another host): it is the one named.
    gang.rank_failed(1, "was killed by SIGKILL")
    assert gang.check(101.5).sentence() == "rank 1 was killed by SIGKILL"


def test_a_rank_that_failed_alone_is_named_once_the_echo_window_passed():
    gang = _ready_gang()
    gang.suspect(1, "failed while load: FileNotFoundError: config.json", 10.0)
    assert gang.check(10.9) is None
    failure = gang.check(11.0)
    assert failure is not None and failure.rank == 1 and "FileNotFoundError" in failure.reason


def test_a_stopped_rank_that_owes_progress_fails_the_gang_before_its_deadline_and_an_idle_one_does_not():
    gang = _ready_gang()
    assert gang.check(100, frozenset({1})) is None  # idle: it owes nothing
    gang.work_sent(100)
    failure = gang.check(100.5, frozenset({1}))
    assert failure is not None and failure.rank == 1 and "stopped" in failure.reason and "prefill" in failure.reason
