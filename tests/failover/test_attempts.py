"""The attempts loop of a failover entry, with plain coroutines for targets:
it returns the first that starts, goes on only after a failure that lets
the next one try, tells each fall-through, and stops when time is up."""

from __future__ import annotations

import asyncio

import pytest

from mlxd.errors import BadRequest, MlxdError, ModelLoadFailed, NotForThisModel, ServiceUnavailable
from mlxd.failover.attempts import first_that_starts


def run(order, outcomes, time_left=lambda: 10.0):
    tried: list[str] = []
    told: list[tuple[str, str, str]] = []

    async def start_on(target: str) -> str:
        tried.append(target)
        outcome = outcomes[target]
        if isinstance(outcome, MlxdError):
            raise outcome
        return outcome

    def fell_through(target: str, error: MlxdError, following: str) -> None:
        told.append((target, type(error).__name__, following))

    result = asyncio.run(first_that_starts(order, start_on, time_left=time_left, fell_through=fell_through, name="fo"))
    return result, tried, told


def test_a_model_that_cannot_give_the_answer_lets_the_next_one_try():
    outcomes = {"local": NotForThisModel("no tool-call format", param="tools"), "remote": "started on remote"}
    result, tried, told = run(["local", "remote"], outcomes)
    assert result == "started on remote" and tried == ["local", "remote"]
    assert told == [("local", "NotForThisModel", "remote")]


def test_a_request_that_is_wrong_everywhere_is_raised_from_the_first_target():
    outcomes = {"a": BadRequest("bad image", param="messages"), "b": "never"}
    with pytest.raises(BadRequest) as raised:
        run(["a", "b"], outcomes)
    assert raised.value.message == "bad image" and not isinstance(raised.value, NotForThisModel)


def test_the_last_targets_failure_is_the_answer_and_no_time_left_stops_early():
    outcomes = {"a": ModelLoadFailed("a broke"), "b": NotForThisModel("too long", code="context_length_exceeded")}
    with pytest.raises(NotForThisModel):
        run(["a", "b"], outcomes)
    with pytest.raises(ModelLoadFailed):
        run(["a", "b"], outcomes, time_left=lambda: 0.0)


def test_no_target_to_try_is_a_503():
    with pytest.raises(ServiceUnavailable) as raised:
        run([], {})
    assert raised.value.status_code == 503 and "`fo`" in raised.value.message
