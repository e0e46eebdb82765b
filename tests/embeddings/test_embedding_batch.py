"""The batching core: which inputs share a forward pass, and whose results
go where. Pure and deterministic: no model, no clock."""

from __future__ import annotations

import pytest

from mlxd.engine.embedding_batch import BatchQueue


def ids(n: int, fill: int = 7) -> list[int]:
    return [fill] * n


def test_concurrent_requests_share_one_forward_pass() -> None:
    queue = BatchQueue(max_tokens=1000)
    queue.add("a", [ids(5)])
    queue.add("b", [ids(6), ids(4)])
    batch = queue.take()
    assert batch is not None
    assert {r.request for r in batch.rows} == {"a", "b"}
    assert len(batch.rows) == 3
    assert queue.take() is None


def test_a_batch_is_sorted_by_length_and_bounded_by_padded_tokens() -> None:
    queue = BatchQueue(max_tokens=40)
    queue.add("r", [ids(10), ids(2), ids(9), ids(3), ids(20)])
    first = queue.take()
    assert first is not None
    # 2, 3, 9, 10: four rows padded to 10 = 40 tokens; adding 20 would make 100.
    assert [r.length for r in first.rows] == [2, 3, 9, 10]
    assert first.padded_tokens == 40
    second = queue.take()
    assert second is not None and [r.length for r in second.rows] == [20]


def test_an_input_longer_than_the_bound_still_runs_alone() -> None:
    queue = BatchQueue(max_tokens=8)
    queue.add("r", [ids(30), ids(1)])
    first, second = queue.take(), queue.take()
    assert first is not None and [r.length for r in first.rows] == [1]
    assert second is not None and [r.length for r in second.rows] == [30]


def test_rows_per_batch_are_bounded() -> None:
    queue = BatchQueue(max_tokens=10_000, max_rows=3)
    queue.add("r", [ids(1)] * 7)
    sizes = []
    while (batch := queue.take()) is not None:
        sizes.append(len(batch.rows))
    assert sizes == [3, 3, 1]


def test_results_come_back_in_each_requests_input_order() -> None:
    queue = BatchQueue(max_tokens=12)
    queue.add("a", [ids(6, 1), ids(1, 2), ids(3, 3)])
    queue.add("b", [ids(2, 4), ids(5, 5)])
    finished = {}
    while (batch := queue.take()) is not None:
        # The "vector" of a row is its token, so we can see where it went.
        for request, outputs in queue.deliver(batch, [row.ids[0] for row in batch.rows]):
            finished[request] = outputs
    assert finished == {"a": [1, 2, 3], "b": [4, 5]}


def test_equal_lengths_keep_arrival_order() -> None:
    queue = BatchQueue(max_tokens=6)
    queue.add("first", [ids(3, 1)])
    queue.add("second", [ids(3, 2)])
    queue.add("third", [ids(3, 3)])
    batch = queue.take()
    assert batch is not None and [r.request for r in batch.rows] == ["first", "second"]


def test_a_cancelled_request_leaves_the_queue_and_its_running_rows_are_dropped() -> None:
    queue = BatchQueue(max_tokens=4)
    queue.add("gone", [ids(4), ids(4)])
    queue.add("kept", [ids(4)])
    running = queue.take()
    assert running is not None and [r.request for r in running.rows] == ["gone"]
    queue.cancel("gone")
    assert queue.deliver(running, ["x"]) == []
    last = queue.take()
    assert last is not None and [r.request for r in last.rows] == ["kept"]
    assert queue.deliver(last, ["y"]) == [("kept", ["y"])]
    assert queue.take() is None


def test_a_failed_pass_fails_exactly_its_requests() -> None:
    queue = BatchQueue(max_tokens=4)
    queue.add("a", [ids(2), ids(9)])
    queue.add("b", [ids(2)])
    queue.add("c", [ids(8)])
    batch = queue.take()
    assert batch is not None
    assert sorted(queue.fail(batch)) == ["a", "b"]
    # a's long row no longer waits; c is untouched.
    rest = queue.take()
    assert rest is not None and [r.request for r in rest.rows] == ["c"]
    assert not queue.pending("a") and queue.pending("c")


def test_a_request_key_cannot_be_queued_twice() -> None:
    queue = BatchQueue(max_tokens=4)
    queue.add("a", [ids(1)])
    with pytest.raises(ValueError):
        queue.add("a", [ids(1)])


def test_an_interactive_query_goes_in_the_next_pass_however_much_bulk_work_waits() -> None:
    queue = BatchQueue(max_tokens=20)
    queue.add("indexer", [ids(10) for _ in range(20)], priority="bulk")
    queue.add("editor", [ids(10)], priority="interactive")
    first = queue.take()
    assert first is not None and first.rows[0].request == "editor"
    assert [r.request for r in first.rows] == ["editor", "indexer"], "the room left is topped up with bulk rows"


def test_bulk_inputs_still_get_their_turns_under_sustained_interactive_load() -> None:
    queue = BatchQueue(max_tokens=10)  # one row of 10 tokens a pass
    queue.add("indexer", [ids(10) for _ in range(5)], priority="bulk")
    firsts = []
    for turn in range(27):
        queue.add(("editor", turn), [ids(10)], priority="interactive")  # one more query every pass
        batch = queue.take()
        assert batch is not None
        firsts.append("bulk" if batch.rows[0].request == "indexer" else "interactive")
    # Interactive and bulk take turns 8 : 1 (as in residency's fair queue).
    assert firsts.count("bulk") == 3 and firsts[8] == "bulk" and firsts[:8] == ["interactive"] * 8


def test_without_priorities_the_queue_is_as_before() -> None:
    queue = BatchQueue(max_tokens=40)
    queue.add("a", [ids(10), ids(2)])
    queue.add("b", [ids(3)], priority="no such class")  # an unknown class is the default one
    batch = queue.take()
    assert batch is not None and [r.length for r in batch.rows] == [2, 3, 10]
