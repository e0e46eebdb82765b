"""Dynamic batching of embedding and rerank inputs: the pure core.

Concurrent requests put their inputs (token id lists) here; each forward pass
takes the next batch from everything pending, whoever sent it. A batch is
bounded by its padded size (rows x longest row), the figure a forward pass
costs, and is cut from the inputs sorted by length, so rows of like length
share a pass and little of it is padding. Results go back to each request in
the order of its own inputs, whatever order the batches ran in.

Inputs carry their request's priority class (docs/apps.md, Priority): a
batch is drawn first from the class whose turn it is (interactive, default
and bulk take turns 8 : 4 : 1, as in residency's fair queue), shortest
first, and what room is left is topped up from the other classes, most
urgent first. So an editor's query is embedded in the next pass, however
many of an indexer's inputs wait, and the indexer still gets its turns.

No I/O, no clock, no threads: the engine's shell (``mlxd.engine.embedding``)
adds requests, asks for batches, runs them on the MLX worker and hands the
rows back. Ties in length keep arrival order, so the same arrivals always
give the same batches (the tests rely on it).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxd.caller import PRIORITIES, Stride, class_of, urgency


@dataclass(frozen=True)
class Row:
    """One input of one request, as a forward pass sees it."""

    request: Hashable
    index: int
    ids: tuple[int, ...]
    # Token type ids (a rerank pair's query and document); empty: all zero.
    types: tuple[int, ...] = ()
    # Arrival order across all requests: the tie-break between equal lengths.
    seq: int = 0

    @property
    def length(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Batch:
    rows: tuple[Row, ...]

    @property
    def width(self) -> int:
        """The longest row: every row is padded to it."""
        return max((r.length for r in self.rows), default=0)

    @property
    def padded_tokens(self) -> int:
        return self.width * len(self.rows)

    @property
    def real_tokens(self) -> int:
        return sum(r.length for r in self.rows)


@dataclass
class _Pending:
    outputs: list[Any]
    left: int


@dataclass
class BatchQueue:
    """Inputs waiting for a forward pass, and the results of the requests
    whose inputs are still running. ``max_tokens`` bounds a batch's padded
    tokens (a single input longer than that runs alone); ``max_rows`` its
    rows."""

    max_tokens: int
    max_rows: int = 256
    # Waiting rows by priority class, each kept sorted by (length, arrival).
    _waiting: dict[str, list[tuple[int, int, Row]]] = field(default_factory=dict)
    _requests: dict[Hashable, _Pending] = field(default_factory=dict)
    _seq: int = 0
    _turns: Stride = field(default_factory=Stride)

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_rows < 1:
            raise ValueError("a batch must have room for at least one token and one row")

    def add(self, request: Hashable, inputs: Sequence[Sequence[int]],
            types: Sequence[Sequence[int]] | None = None, priority: str = "default") -> None:
        """Queue ``inputs`` (token id lists) of ``request`` (a key unique
        among the requests pending), of its caller's ``priority`` class."""
        if request in self._requests:
            raise ValueError(f"request {request!r} is already queued")
        self._requests[request] = _Pending([None] * len(inputs), len(inputs))
        for index, ids in enumerate(inputs):
            row = Row(request, index, tuple(ids), tuple(types[index]) if types is not None else (), self._seq)
            self._seq += 1
            bisect.insort(self._waiting.setdefault(class_of(priority), []), (row.length, row.seq, row))

    def __len__(self) -> int:
        """Rows waiting for a forward pass."""
        return sum(len(rows) for rows in self._waiting.values())

    def pending(self, request: Hashable) -> bool:
        return request in self._requests

    def most_urgent(self) -> int:
        """The most urgent class of the rows waiting (``urgency``; one past
        the least urgent when none wait)."""
        return next((urgency(c) for c in PRIORITIES if self._waiting.get(c)), len(PRIORITIES))

    def take(self) -> Batch | None:
        """The next batch, or None when nothing waits.

        It starts at the shortest waiting row of the class whose turn it is
        and grows through longer ones while the padded size stays within
        bounds, then through the other classes' rows, most urgent first. Taking the shortest first
        keeps a flood of long inputs from starving short ones for long, and
        a long row alone over the bound still runs (on its own)."""
        turn = self._turns.pick([c for c in PRIORITIES if self._waiting.get(c)])
        if turn is None:
            return None
        self._turns.served(turn)
        rows: list[Row] = []
        width = 0
        for c in (turn, *(c for c in PRIORITIES if c != turn)):
            waiting = self._waiting.get(c, [])
            taken = 0
            for length, _, _ in waiting:
                wider = max(width, length)
                if rows and (wider * (len(rows) + 1) > self.max_tokens or len(rows) >= self.max_rows):
                    break
                width, taken = wider, taken + 1
                rows.append(waiting[taken - 1][2])
            del waiting[:taken]
        return Batch(tuple(rows))

    def deliver(self, batch: Batch, outputs: Sequence[Any]) -> list[tuple[Hashable, list[Any]]]:
        """Record ``outputs`` (one per row of ``batch``, in its order);
        returns the requests this completed, each with its outputs in input
        order. Rows of a request cancelled meanwhile are dropped."""
        if len(outputs) != len(batch.rows):
            raise ValueError(f"{len(outputs)} outputs for a batch of {len(batch.rows)} rows")
        done = []
        for row, output in zip(batch.rows, outputs):
            pending = self._requests.get(row.request)
            if pending is None:
                continue
            pending.outputs[row.index] = output
            pending.left -= 1
            if pending.left == 0:
                del self._requests[row.request]
                done.append((row.request, pending.outputs))
        return done

    def fail(self, batch: Batch) -> list[Hashable]:
        """The batch's forward pass failed: its requests are dropped (rows
        still waiting included) and returned, so each can be told."""
        failed = list(dict.fromkeys(r.request for r in batch.rows if r.request in self._requests))
        for request in failed:
            self.cancel(request)
        return failed

    def cancel(self, request: Hashable) -> None:
        """Forget ``request``: its waiting rows leave the queue, its running
        rows' results are dropped when they come."""
        if self._requests.pop(request, None) is None:
            return
        for c, waiting in self._waiting.items():
            self._waiting[c] = [entry for entry in waiting if entry[2].request != request]
