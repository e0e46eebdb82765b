"""The decisions of speculative decoding, as pure code (no MLX, no clock).

- ``NgramIndex``: prompt lookup's drafts. The latest earlier place where the
  last n tokens (longest n first) occurred, and the tokens that followed it
  there. Kept up to date token by token, so a draft costs O(n), not a scan of
  the history: a coding agent's prompt holds the file it asks to edit, and the
  edit repeats it.
- ``accept``: how much of a verified block a sequence keeps. Drafts are point
  masses (the n-gram's continuation, a draft model's greedy token), so the
  standard acceptance rule (accept d with probability p(d), else draw from
  the residual p - q normalised) is exactly "draw from p as without
  speculation, keep the draft while the draw equals it": greedy output is the
  same tokens, sampled output the same distribution.
- ``rollback``: per sequence, how many verified positions to drop from the
  batch's cache, as one trim for all plus a remainder per row.
- ``SpecStats``: the figures /v1/status shows. The auto-off is its own core
  (``speculative_governor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The longest n-gram prompt lookup matches on; shorter ones are tried after
# it, down to MIN_NGRAM (a single token's last occurrence guesses too often).
MAX_NGRAM = 3
MIN_NGRAM = 2


class NgramIndex:
    """Where each n-gram (n <= ``max_n``) last occurred with a token after it."""

    def __init__(self, tokens: Sequence[int] = (), max_n: int = MAX_NGRAM, min_n: int = MIN_NGRAM) -> None:
        self.max_n = max_n
        self.min_n = max(1, min_n)
        self.tokens: list[int] = []
        # n-gram -> the index of the token that followed its latest occurrence.
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        history = self.tokens
        end = len(history)
        # The n-grams ending at the previous token now have a continuation.
        for n in range(1, min(self.max_n, end) + 1):
            self._next[tuple(history[end - n : end])] = end
        history.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of
        the longest matching suffix; [] when nothing matches."""
        if k <= 0:
            return []
        start = self._continuation(self.tokens)
        return [] if start is None else self.tokens[start : start + k]

    def would_draft(self, then: int | None = None) -> bool:
        """Whether ``draft`` finds something, with ``then`` appended first
        (not kept). Approximate in one case only: a suffix whose latest
        occurrence ends at the last token, which ``then`` itself follows."""
        history = self.tokens if then is None else [*self.tokens[-self.max_n :], then]
        return self._continuation(history) is not None

    def could_draft_next(self) -> bool:
        """Whether ``would_draft(then)`` can hold for any ``then``: every
        suffix it matches ends in the last token and ``then``, so that last
        token must have occurred before, followed by something. Exact in the
        one direction that matters: False means no token coming next finds
        a draft."""
        return bool(self.tokens) and (self.tokens[-1],) in self._next

    def _continuation(self, history: Sequence[int]) -> int | None:
        """Where what followed the latest occurrence of ``history``'s longest
        known suffix starts; None when no suffix matches."""
        for n in range(min(self.max_n, len(history)), self.min_n - 1, -1):
            start = self._next.get(tuple(history[len(history) - n :]))
            if start is not None:
                return start
        return None


class ShadowDraft:
    """What prompt lookup would have kept on one row had it drafted, told
    from the row's plain steps, where drafting costs no forward pass: the
    draft it would have made, held against the tokens that came. Each
    token is then a verify step's kept draft (``step`` says True) or a token
    that step would have drawn itself: after a miss, a draft kept whole, or
    no draft at all. ``T`` tokens of which ``K`` were kept would have taken
    ``T - K`` verify steps a row."""

    def __init__(self, k: int, index: NgramIndex | None = None) -> None:
        self.k = max(1, k)
        # The draft in hand: from the row's history as it joins, as a verify step then would.
        self.pending: list[int] = index.draft(self.k) if index is not None else []

    def step(self, index: NgramIndex, token: int) -> bool:
        """``token`` came next; ``index`` is the row's history without it
        (it is appended here). Whether the draft in hand had it."""
        kept = bool(self.pending) and self.pending[0] == token
        index.append(token)
        if kept:
            # Kept whole, none is left: the verify step's own token comes
            # next, outside any draft, as after a row drafts nothing.
            del self.pending[0]
            return True
        self.pending = index.draft(self.k)
        return False

    def forget(self) -> None:
        """The row verified real drafts: what it would have drafted no longer follows."""
        self.pending = []


def accept(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafts to keep: ``sampled[j]`` is the token drawn at the
    position after ``drafts[j - 1]`` (after the last emitted token for j = 0);
    drafts are kept while each equals the draw before it. The sequence then
    emits ``sampled[: accepted + 1]``."""
    n = 0
    while n < len(drafts) and n < len(sampled) and sampled[n] == drafts[n]:
        n += 1
    return n


def next_draft_length(current: int, drafted: int, accepted: int, most: int) -> int:
    """How many drafts a sequence asks for next step: twice as many after a
    step that kept all it drafted, half as many (but one past what it kept)
    after a miss. A row whose drafts keep failing drafts little, so the block
    (as wide as the longest row's) stays narrow; a row that copies is back
    at ``most`` in a step or two. (Growing by one after a miss and dropping
    to what was kept held a 200-line file echo to 2.6 tokens a step whatever
    K was: each line's number misses once, and the ramp back never ended.)"""
    if drafted == 0:
        return current
    if accepted >= drafted:
        return min(most, current * 2)
    return max(1, min(most, max(accepted + 1, current // 2)))


@dataclass(frozen=True)
class Rollback:
    """How a batch cache that verified ``block`` positions in every row
    gives back what each row did not keep: ``trim`` positions from all rows,
    then ``roll[i]`` more from row i (mlx-lm's right-padding roll)."""

    trim: int
    roll: tuple[int, ...]

    @property
    def uniform(self) -> bool:
        return not any(self.roll)


def rollback(block: int, kept: Sequence[int]) -> Rollback:
    """``kept[i]``: positions row i keeps of the ``block`` it verified (its
    last emitted token and its accepted drafts)."""
    drop = [block - k for k in kept]
    if any(d < 0 for d in drop):
        raise ValueError(f"a row cannot keep more than the {block} positions it verified: {list(kept)}")
    common = min(drop, default=0)
    return Rollback(common, tuple(d - common for d in drop))


@dataclass
class SpecStats:
    """What /v1/status and /metrics show of a model's speculation."""

    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # of which were kept
    steps: int = 0  # speculative steps, per sequence
    emitted: int = 0  # tokens those steps emitted, per sequence summed

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        self.emitted += accepted + 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def accepted_per_step(self) -> float | None:
        return self.emitted / self.steps if self.steps else None
