"""The rows a rank decodes together, and their KV caches.

A gang's ranks run one continuous batch in lockstep: every rank holds the
same rows in the same order, so each batched step's collectives (inside the
model, and rank 0's decision after it) meet their peers. This module keeps
that state and nothing else; the step program that feeds it is the rank's
(``distributed/rank.py``).

The caches follow the local batch's rule: a row decoding alone keeps its own
cache (a single request decodes exactly as one process does, byte for byte),
and only from the second row on are the rows' caches merged into mlx-lm's
batch caches (``merge``, ``extend``, ``filter``, ``extract``), left-padded
to a common length. When all but one row have left, the last one's cache is
taken out of the batch again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Row:
    """One request on a rank, from its first decode step to its end."""

    rid: str
    prompt_tokens: int
    max_tokens: int
    keep_as: int | None  # the entry its cache is kept under when it ends
    token: int = 0  # the next token it feeds (rank 0's last decision)
    step: int = 0  # tokens decided so far
    # Rank 0 only: how its tokens are drawn, and what the processors read.
    sampler: Any = None
    processors: list[Any] = field(default_factory=list)
    history: Any = None
    top: int | None = None

    @property
    def cached(self) -> int:
        """Tokens its cache holds: the prompt and every decided token but the
        last, which was never fed."""
        return self.prompt_tokens + max(0, self.step - 1)


@dataclass(eq=False)
class Prefill:
    """A row whose prompt is still being read into its own cache."""

    row: Row
    cache: list[Any]
    tokens: list[int]
    done: int  # prompt tokens the cache holds
    chunk: int  # prompt tokens per prefill step
    prompt: Any = None  # ``tokens`` as an mx.array, made once for all its chunks
    urgency: int = 1  # its caller's priority class, 0 most urgent (mlxd.caller.PRIORITIES)


class RowBatch:
    """The rows decoding on this rank, in the order every rank holds them."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.cache: list[Any] | None = None  # one row's own cache, or the batch's
        self.merged = False  # whether ``cache`` is mlx-lm's batch cache

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, row: Row, cache: list[Any]) -> None:
        """``row`` (its first token decided, its cache holding its prompt)
        decodes with the others from the next step on."""
        if not self.rows:
            self.cache, self.merged = cache, False
        elif not self.merged:
            assert self.cache is not None
            self.cache = [old.merge([old, new]) for old, new in zip(self.cache, cache)]
            self.merged = True
        else:
            assert self.cache is not None
            joining = [new.merge([new]) for new in cache]
            for batch_layer, new in zip(self.cache, joining):
                batch_layer.extend(new)
        self.rows.append(row)

    def inputs(self) -> Any:
        """The next step's input: each row's last token, one per row."""
        import mlx.core as mx

        return mx.array([[row.token] for row in self.rows])

    def leave(self, leaving: set[int]) -> dict[int, list[Any]]:
        """Takes the rows at the indices ``leaving`` out of the batch; each
        one's own cache, by index (what the prefix cache keeps of it)."""
        if not leaving:
            return {}
        assert self.cache is not None
        if not self.merged:
            caches = {0: self.cache}
            self.rows, self.cache = [], None
            return caches
        caches = {i: [layer.extract(i) for layer in self.cache] for i in sorted(leaving)}
        staying = [i for i in range(len(self.rows)) if i not in leaving]
        self.rows = [self.rows[i] for i in staying]
        if not staying:
            self.cache, self.merged = None, False
        elif len(staying) == 1:
            # Alone again: its own cache, so it decodes as one process would.
            self.cache, self.merged = [layer.extract(staying[0]) for layer in self.cache], False
        else:
            for layer in self.cache:
                layer.filter(staying)
        return caches
