"""Victim choice as a table: loaded models in, the models that must leave out."""

import pytest

from mlxd.residency.eviction import (
    Candidate,
    Preemption,
    to_fit_budget,
    to_make_room,
    to_pass_over,
    to_preempt,
)


def idle(name: str, gb: int, last_used: float, pinned: bool = False) -> Candidate:
    return Candidate(name, gb, last_used, busy=False, pinned=pinned)


def busy(name: str, gb: int, last_used: float, pinned: bool = False) -> Candidate:
    return Candidate(name, gb, last_used, busy=True, pinned=pinned)


# Sizes in whole units: the functions only add and compare.
A, B, C = idle("a", 2, 10), idle("b", 2, 30), idle("c", 3, 20)
X, Y = busy("x", 3, 5), busy("y", 2, 1)
PIN_IDLE, PIN_BUSY = idle("pin", 4, 0, pinned=True), busy("pinb", 4, 0, pinned=True)


@pytest.mark.parametrize(
    "over, candidates, expected",
    [
        (0, [A, B, C], ()),  # under the budget: nobody leaves
        (-3, [A, B, C], ()),
        (1, [A, B, C], ("a",)),  # least recently used first
        (3, [A, B, C], ("a", "c")),  # a alone (2) is not enough
        (99, [A, B, C], ("a", "c", "b")),  # not all or nothing: each one helps
        (1, [X, Y, A], ("a",)),  # busy models are never unloaded here
        (1, [PIN_IDLE, B], ("b",)),  # pinned ones neither
        (1, [X, PIN_IDLE], ()),
    ],
)
def test_fitting_the_budget_unloads_idle_models_lru_first(over, candidates, expected):
    assert to_fit_budget(over, candidates) == expected


@pytest.mark.parametrize(
    "need, available, candidates, expected",
    [
        (2, 2, [A, B], ()),  # already fits (free plus what is leaving)
        (3, 2, [A, B], ("a",)),
        (5, 0, [A, B, C], ("a", "c")),
        (8, 0, [A, B, C], None),  # all idle = 7 < 8: evict nobody in vain
        (7, 0, [A, B, C], ("a", "c", "b")),
        (3, 0, [X, A], None),  # busy x is not evictable
        (3, 0, [PIN_IDLE, A], None),  # nor pinned
        (3, 1, [PIN_IDLE, A], ("a",)),
    ],
)
def test_making_room_is_all_or_nothing(need, available, candidates, expected):
    assert to_make_room(need, available, candidates) == expected


@pytest.mark.parametrize(
    "need, available, candidates, expected",
    [
        # idle a (2) + 1 free is short of 5: busy y (least recently used) goes too
        (5, 1, [A, X, Y], Preemption(evict=("a",), drain=("y",))),
        (7, 0, [A, X, Y], Preemption(evict=("a",), drain=("y", "x"))),
        (8, 0, [A, X, Y], None),  # even everything is not enough
        (3, 0, [PIN_BUSY, Y, A], Preemption(evict=("a",), drain=("y",))),
        (5, 0, [PIN_BUSY, Y, A], None),  # a pinned model is never preempted
        # idle bytes count once: 1 free + 2 idle + 2 from y = 5 fits
        (5, 1, [A, Y, X], Preemption(evict=("a",), drain=("y",))),
    ],
)
def test_preemption_evicts_the_idle_then_the_least_recently_used_busy(need, available, candidates, expected):
    assert to_preempt(need, available, candidates) == expected


@pytest.mark.parametrize(
    "need, available, candidates, expected",
    [
        (2, 0, [X, Y], ("y",)),  # y was used least recently
        (3, 0, [X, Y], ("y", "x")),  # y alone (2) is short of 3
        (3, 3, [X, Y], None),  # it already fits: nothing to drain
        (6, 0, [X, Y], None),  # draining both is not enough
        (3, 0, [PIN_BUSY, X], ("x",)),
        (3, 0, [A, B], None),  # idle models are eviction's business, not fairness's
        # idle a (2) plus y (2) make 4: x keeps serving
        (4, 0, [A, X, Y], ("y",)),
        (7, 0, [A, X, Y], ("y", "x")),
        (8, 0, [A, X, Y], None),
    ],
)
def test_a_request_passed_over_drains_busy_models_lru_first(need, available, candidates, expected):
    assert to_pass_over(need, available, candidates) == expected
