"""The in-memory history with a fake clock: per-step speed over busy time,
queue, first-token percentiles, cache hits and memory, in a bounded ring."""

from __future__ import annotations

import json
from dataclasses import dataclass

from mlxd.monitoring.history import History
from mlxd.monitoring.metrics import ThroughputWindow


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class View:
    name: str
    queued: int = 0
    active: int = 0


@dataclass
class Manager:
    models: tuple
    committed: int = 100
    budget: int = 1000


def test_a_step_holds_the_speed_over_busy_time_and_the_finished_requests_figures():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    history = History(window, step_seconds=5, span_seconds=60, clock=clock)
    history.sample(Manager((View("a"), View("b"))))
    window.begin("a")
    clock.now += 2
    window.add("a", 40)
    window.end("a")
    for ttft in (0.1, 0.2, 0.3, 0.4, 2.0):
        history.request_finished("a", ttft, cached_tokens=10)
    clock.now += 3
    history.sample(Manager((View("a", queued=2, active=1), View("b")), committed=400))
    doc = history.document()
    a, b = doc["models"]["a"], doc["models"]["b"]
    assert a["tokens_per_second"] == [None, 20.0], "40 tokens in 2 busy seconds, not over the 5 s step"
    assert b["tokens_per_second"] == [None, None], "idle is no rate at all"
    assert a["queued"] == [0, 2] and a["active"] == [0, 1]
    assert a["ttft_p50_seconds"] == [None, 0.3] and a["ttft_p95_seconds"] == [None, 2.0]
    assert a["cached_tokens"] == [0, 50] and a["requests"] == [0, 5]
    assert doc["committed_bytes"] == [100, 400] and doc["budget_bytes"] == [1000, 1000]
    json.dumps(doc, allow_nan=False)


def test_the_ring_keeps_one_span_and_a_reader_can_ask_for_what_is_new():
    clock = FakeClock()
    history = History(ThroughputWindow(60, clock=clock), step_seconds=5, span_seconds=60, clock=clock)
    for _ in range(100):
        clock.now += 5
        history.sample(Manager((View("a"),)))
    assert len(history) == 12
    doc = history.document()
    assert len(doc["t"]) == 12 and doc["t"][-1] == clock.now
    newer = history.document(after=doc["t"][-3])
    assert newer["t"] == doc["t"][-2:] and len(newer["models"]["a"]["queued"]) == 2


def test_a_model_added_later_has_nulls_before_it_existed():
    clock = FakeClock()
    history = History(ThroughputWindow(60, clock=clock), step_seconds=5, span_seconds=60, clock=clock)
    history.sample(Manager((View("a"),)))
    clock.now += 5
    history.sample(Manager((View("a"), View("new"))))
    assert history.document()["models"]["new"]["queued"] == [None, 0]
