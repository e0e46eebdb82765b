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
- ``Governor``: speculation turns itself off for a model when its measured
  speed-up over a rolling window is below 1, and tries again when the mix of
  sequences changes (each batch size has its own window) or, while off, now
  and then.
"""

from __future__ import annotations

import collections
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
        history = self.tokens
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(history)), self.min_n - 1, -1):
            start = self._next.get(tuple(history[len(history) - n :]))
            if start is not None:
                return history[start : start + k]
        return []


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
    """How many drafts a sequence asks for next step: one more after a step
    that kept all it drafted, else one past what it kept. A row whose drafts
    fail drafts little, so the block (as wide as the longest row's) stays
    narrow; a row that copies grows back to ``most``."""
    if drafted == 0:
        return current
    if accepted >= drafted:
        return min(most, current + 1)
    return max(1, min(most, accepted + 1))


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


@dataclass(frozen=True)
class StepRecord:
    speculative: bool
    tokens: int  # tokens emitted, all rows together
    seconds: float


class _Window:
    """The recent steps at one batch size, and whether it speculates there."""

    def __init__(self, window: int) -> None:
        self.active = True
        self.spec: collections.deque[StepRecord] = collections.deque(maxlen=window)
        self.plain: collections.deque[StepRecord] = collections.deque(maxlen=max(4, window // 4))
        self.steps = 0
        self.speedup: float | None = None


class Governor:
    """Whether the next step speculates, from the measured speed of recent
    speculative and plain steps at the current batch size.

    While on, one step in ``probe_every`` is plain, so the baseline stays
    measured; speculation goes off once ``min_samples`` speculative steps and
    ``min_plain`` plain ones say it is slower than plain decoding (a short
    reply must not pay for a long trial). While off, one step in
    ``retry_every`` speculates (rarely: each such probe costs); it comes back
    on when those say it pays. Each batch size (the mix of sequences) keeps its own window: a size
    not seen yet starts on, and a size it went back to resumes where it was.
    """

    def __init__(self, window: int = 32, probe_every: int = 8, min_samples: int = 4, min_plain: int = 1,
                 retry_every: int = 32) -> None:
        self.window = window
        self.probe_every = max(2, probe_every)
        self.retry_every = max(2, retry_every)
        self.min_samples = min_samples
        self.min_plain = min_plain
        self._sizes: dict[int, _Window] = {}
        self._now = _Window(window)
        # The latest speed-up measured at any size (what status shows
        # while the current size has none yet).
        self._latest: float | None = None

    @property
    def active(self) -> bool:
        return self._now.active

    @property
    def speedup(self) -> float | None:
        return self._now.speedup if self._now.speedup is not None else self._latest

    def choose(self, batch: int) -> bool:
        """Whether the next step of a batch of ``batch`` sequences speculates."""
        now = self._now = self._sizes.setdefault(batch, _Window(self.window)) if batch else self._now
        now.steps += 1
        probe = now.steps % (self.probe_every if now.active else self.retry_every) == 0
        return now.active != probe

    def record(self, speculative: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0 or tokens <= 0:
            return
        now = self._now
        (now.spec if speculative else now.plain).append(StepRecord(speculative, tokens, seconds))
        needed = self.min_samples if now.active else 2
        if len(now.plain) < self.min_plain or len(now.spec) < needed:
            return
        now.speedup = self._latest = _rate(now.spec) / _rate(now.plain)
        if now.active and now.speedup < 1.0:
            now.active = False
            # Off: what it measures from now on are the rare probes.
            now.spec.clear()
        elif not now.active and now.speedup >= 1.0:
            now.active = True


def _rate(records: collections.deque[StepRecord]) -> float:
    return sum(r.tokens for r in records) / sum(r.seconds for r in records)


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
