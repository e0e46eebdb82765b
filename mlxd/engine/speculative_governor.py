"""Whether a speculative batch's next step speculates (the auto-off), as a
pure core fed measured step times: no MLX, no clock.

Speculation pays when a step that verifies drafts emits more tokens per
second than a plain step of the same batch would. Both rates are measured
in the same batch, at the same batch size, while it serves:

- a *mix* is a batch size, rounded up to a power of two (1, 2, 4, 8, ...):
  rows join and leave one at a time under continuous batching, and sizes 5
  to 8 cost alike, so they share one decision instead of each paying a trial
  of its own;
- a step *speculated* only if some row verified drafts: a step where the
  drafter found nothing is a plain step and is measured as one (free chat
  gives the baseline for free);
- while on, the baseline is measured first (``min_plain`` plain steps right
  after the first speculative one, and as many more at steps 6, 10, ...), then
  one step in ``probe_every`` stays plain so it stays current; speculation goes off as soon as ``min_spec``
  speculative steps and the baseline say it is slower: a losing mix is off
  after ``min_spec + min_plain`` steps (5 by default) when every row drafts;
- while off, one step in ``retry`` speculates. A probe that pays brings the
  interval back to ``retry_every``; one that loses doubles it, up to
  ``max_retry``, so a mix that keeps losing costs ever less; speculation is
  back on once the last ``retry_samples`` probes pay together: a mix that
  wins again is back within ``max_retry + retry_samples * retry_every``
  steps. A request joining the batch is a new mix: the interval goes back to
  ``retry_every``;
- ``hold_on``: every step speculates but the baseline's plain ones
  (``auto_off: false``); the speed-up is measured and never acted on.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field


def mix_of(batch: int) -> int:
    """The batch size rounded up to a power of two."""
    return 1 << max(0, batch - 1).bit_length()


@dataclass
class _Mix:
    window: int
    retry: int
    active: bool = True
    spec: collections.deque[tuple[int, float]] = field(init=False)
    plain: collections.deque[tuple[int, float]] = field(init=False)
    steps: int = 0  # since the decision last changed; while off, since the last probe
    speedup: float | None = None

    def __post_init__(self) -> None:
        self.spec = collections.deque(maxlen=self.window)
        self.plain = collections.deque(maxlen=self.window)


class Governor:
    def __init__(self, window: int = 16, probe_every: int = 16, min_spec: int = 3, min_plain: int = 2,
                 retry_every: int = 8, max_retry: int = 64, retry_samples: int = 2,
                 hold_on: bool = False) -> None:
        self.window = max(2, window)
        self.probe_every = max(2, probe_every)
        self.min_spec = max(1, min_spec)
        self.min_plain = max(1, min_plain)
        self.retry_every = max(2, retry_every)
        self.max_retry = max(self.retry_every, max_retry)
        self.retry_samples = max(1, retry_samples)
        # ``auto_off: false``: speculate at every step; the speed-up is still
        # measured (and shown), never acted on.
        self.hold_on = hold_on
        self._mixes: dict[int, _Mix] = {}
        # The latest speed-up measured in any mix: what status shows while
        # the current one has none yet.
        self._latest: float | None = None
        self._now = self._mix(1)

    @property
    def active(self) -> bool:
        return self._now.active

    @property
    def speedup(self) -> float | None:
        return self._now.speedup if self._now.speedup is not None else self._latest

    def _mix(self, batch: int) -> _Mix:
        key = mix_of(batch)
        mix = self._mixes.get(key)
        if mix is None:
            mix = self._mixes[key] = _Mix(self.window, self.retry_every)
        return mix

    def choose(self, batch: int) -> bool:
        """Whether the next step of a batch of ``batch`` sequences speculates."""
        now = self._now = self._mix(batch) if batch else self._now
        if self.hold_on:
            # Every step speculates but for a plain one now and then, the
            # baseline that status's speed-up is measured against.
            now.steps += 1
            return not (len(now.plain) < self.min_plain or now.steps % self.probe_every == 0)
        if now.active and now.speedup is None and self._latest is not None and self._latest < 1.0:
            # A mix not decided yet starts where the last decision left off:
            # when speculation lost in another mix (a batch of four whose row
            # ended, leaving two), it goes off and its probes turn it on if it
            # pays, instead of a fresh trial that a short batch never ends.
            now.active, now.steps, now.retry = False, 0, self.retry_every
        now.steps += 1
        if not now.active:
            if now.steps < now.retry:
                return False
            now.steps = 0
            return True
        if now.spec and len(now.plain) < self.min_plain:
            return False
        # The first plain steps of a mix can be slow for reasons of their own
        # (a kernel's first compile): two more soon, so the median is a warm one.
        if len(now.plain) < 2 * self.min_plain:
            return now.steps % 4 != 2
        return now.steps % self.probe_every != 0

    def joined(self) -> None:
        """Requests joined the batch: the mix changed, so retry soon."""
        for mix in self._mixes.values():
            mix.retry = self.retry_every

    def record(self, speculative: bool, tokens: int, seconds: float) -> None:
        """What the step just chosen did: ``speculative`` if some row verified
        drafts, the tokens all rows emitted and the seconds it took."""
        if seconds <= 0 or tokens <= 0:
            return
        now = self._now
        (now.spec if speculative else now.plain).append((tokens, seconds))
        if len(now.plain) < self.min_plain or not now.spec:
            return
        if now.active:
            if len(now.spec) < self.min_spec:
                return
            now.speedup = self._latest = _rate(now.spec) / _rate(now.plain)
            if now.speedup < 1.0 and not self.hold_on:
                now.active, now.steps, now.retry = False, 0, self.retry_every
                # Off: what it measures from now on are the probes.
                now.spec.clear()
            return
        if not speculative:
            return
        baseline = _rate(now.plain)
        latest = _rate([now.spec[-1]]) / baseline
        now.retry = self.retry_every if latest >= 1.0 else min(self.max_retry, now.retry * 2)
        if len(now.spec) < self.retry_samples:
            return
        recent = list(now.spec)[-self.retry_samples :]
        now.speedup = self._latest = _rate(recent) / baseline
        if now.speedup >= 1.0:
            now.active, now.steps = True, 0
            now.spec.clear()
            now.spec.extend(recent)


def _rate(records: Iterable[tuple[int, float]]) -> float:
    """Tokens a second, the median of the steps': a step that ran slow for
    reasons of its own (the first use of a kernel shape, the machine busy)
    must not decide alone."""
    return statistics.median(t / s for t, s in records)
