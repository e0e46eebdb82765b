"""Whether a speculative batch's next step speculates (the auto-off), as a
pure core fed measured step times: no MLX, no clock.

Speculation pays when a step that verifies drafts emits more tokens per
second than a plain step of the same batch would. Both rates are measured
in the same batch, at the same batch size, while it serves:

- a *mix* is a batch size, rounded up to a power of two (1, 2, 4, 8, ...):
  rows join and leave one at a time under continuous batching, and sizes 5
  to 8 cost alike, so they share one decision instead of each paying a trial
  of its own; and the rows' mean context, also to a power of two
  (``context_of``): a step's cost grows with it, so plain steps of a code
  edit over a 2,500-token file are no baseline for a chat of 300 tokens
  (measured against them, free chat after code edits read 1.5x where it
  gained 1.0x, on this project's CPU and on an H100);
- a step *speculated* if some row verified drafts, or if asking the
  drafter read back the step computed ahead (what asking costs there, though
  it found nothing); a verify step where no row had drafts is measured as a
  plain one;
- while on, the baseline is measured first (``min_plain`` plain steps right
  after the first speculative one, and as many more in pairs at steps 6-7,
  10-11, ...), then two plain steps in a row every ``2 * probe_every`` keep
  it current (the batch times only plain steps that follow a plain one as
  plain: the first after speculating pays for leaving it, and is timed as
  speculation's, as is the wait for a plain step computed ahead that a
  speculative step reads back first); speculation goes off as soon
  as ``min_spec`` speculative steps and the baseline say it is slower (six:
  a code edit's answer often opens with a few steps of text the prompt does
  not hold); a losing mix is off within ``min_spec + 2 * min_plain`` steps
  when every row drafts;
- speculative steps are measured by their tokens over their time together
  (``_spec_rate``: a step keeps one token or five), plain ones by the median
  step; the step that takes joining rows in is measured as neither;
- while off, one step in ``retry`` speculates; a probe is that step and
  the plain step after it, which pays for leaving it. A probe that pays brings the
  interval back to ``retry_every``; one that loses doubles it, up to
  ``max_retry``, so a mix that keeps losing costs ever less; speculation is
  back on once the last ``retry_samples`` probes pay together: a mix that
  wins again is back within ``max_retry + retry_samples * retry_every``
  steps. A request joining the batch may change what pays, so the next
  probe comes within ``retry_every`` steps (unless one came that recently),
  but the interval stays where the losing probes put it: under continuous
  batching requests join all the time, and a join that started the backoff
  over cost a losing mix a probe every 8, 16, 32... steps after each one
  (free chat at 4 and 8 streams on an H100: 0.91x and 0.89x of plain
  decoding with speculation off). The step that takes the new rows in never
  probes: it is not measured;
- while off, a probe is skipped when the drafts would lose (``shadow``):
  prompt lookup can tell at no cost what its drafts would have kept on the
  plain steps since the last probe, and the mix's last measured speed-up
  says what verifying cost against what it kept then; scaled by what it
  would keep now, below ``probe_at`` the probe waits another interval.
  With speculation off at the end of every run, free chat on an H100 still
  ran at 0.89-0.95x of plain decoding, and what an off mix pays is its
  probes, each a verify step and the step that leaves it; a code edit
  arriving shows in its first plain steps, and the next probe comes;
- ``hold_on``: every step speculates but the baseline's plain ones
  (``auto_off: false``); the speed-up is measured and never acted on.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field


def _power_of_two_from(n: int) -> int:
    """The smallest power of two at least ``n``."""
    return 1 << max(0, n - 1).bit_length()


def mix_of(batch: int) -> int:
    """The batch size rounded up to a power of two."""
    return _power_of_two_from(batch)


def context_of(batch: int, context: int) -> int:
    """The rows' mean context (their tokens, all rows together: ``context``)
    rounded up to a power of two; 0 where it is not known."""
    return _power_of_two_from(-(-context // batch)) if batch and context else 0


@dataclass
class _Mix:
    window: int
    retry: int
    active: bool = True
    spec: collections.deque[tuple[int, float]] = field(init=False)
    plain: collections.deque[tuple[int, float]] = field(init=False)
    steps: int = 0  # since the decision last changed; while off, since the last probe
    speedup: float | None = None
    # While off: the probe interval before the last probe, so that judging
    # it again with its leaving step's cost starts from there.
    retry_before_probe: int = 0
    # The last speed-up measured with the tokens a row its verify steps
    # emitted then: what scales the drafts' shadow into a prediction.
    calibration: tuple[float, float] | None = None
    verified_tokens: int = 0  # while on: the verify steps' tokens, and their rows
    verified_rows: int = 0
    probe_ratio: float = 0.0  # the last probe's tokens a row
    # While off: plain tokens since the last probe (or join), and how many
    # drafts would have kept.
    shadow_seen: int = 0
    shadow_kept: int = 0

    def __post_init__(self) -> None:
        self.spec = collections.deque(maxlen=self.window)
        self.plain = collections.deque(maxlen=self.window)


class Governor:
    def __init__(self, window: int = 16, probe_every: int = 16, min_spec: int = 6, min_plain: int = 2,
                 retry_every: int = 8, max_retry: int = 128, retry_samples: int = 2,
                 hold_on: bool = False, probe_at: float = 0.9, min_shadow: int = 16) -> None:
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
        # A probe is skipped when the drafts' shadow predicts a speed-up
        # below ``probe_at``, once it holds ``min_shadow`` tokens; below
        # 1: the prediction is rough, and the probe is the measurement.
        self.probe_at = probe_at
        self.min_shadow = max(1, min_shadow)
        self._shadowed = False  # the drafter tells its shadow (prompt lookup; a draft model does not)
        self._rows = 1  # the batch the step chosen last serves
        self._mixes: dict[tuple[int, int], _Mix] = {}
        # The latest speed-up measured in any mix: what status shows while
        # the current one has none yet.
        self._latest: float | None = None
        self._now = self._mix(1, 0)
        # The next step chosen takes joining rows in (``joined``), and the
        # step chosen last did (``_unmeasured``): its record, if the batch
        # sends one, is dropped. Tied to the step, not to the next record:
        # the batch does not time the first of a run of plain steps, and a
        # flag waiting for the next record then dropped the run's second
        # step, a real sample, in its place.
        self._joining = False
        self._unmeasured = False
        # The off mix whose last record was a probe, not judged yet: the
        # next record is its leaving step, or it is judged alone. Only
        # judging a probe turns a mix on, so it is still off then.
        self._probed: _Mix | None = None

    @property
    def active(self) -> bool:
        return self._now.active

    @property
    def speedup(self) -> float | None:
        return self._now.speedup if self._now.speedup is not None else self._latest

    def _mix(self, batch: int, context: int) -> _Mix:
        key = (mix_of(batch), context_of(batch, context))
        mix = self._mixes.get(key)
        if mix is None:
            mix = self._mixes[key] = _Mix(self.window, self.retry_every)
        return mix

    def choose(self, batch: int, context: int = 0) -> bool:
        """Whether the next step of a batch of ``batch`` sequences, holding
        ``context`` tokens together, speculates."""
        before = self._now
        now = self._now = self._mix(batch, context) if batch else self._now
        self._rows = batch or self._rows
        self._unmeasured, self._joining = self._joining, False
        if self.hold_on:
            # Every step speculates but for two plain ones now and then, the
            # baseline that status's speed-up is measured against: at the end
            # of each period, not as a mix opens. A mix opens whenever the
            # batch's size or mean context crosses a power of two (a row
            # ending is enough), and opening each with plain steps dropped the
            # drafts that ``auto_off: false`` asks for there.
            now.steps += 1
            return not self._probes_plain(now.steps + 2)
        if now.active and now.speedup is None and self._latest is not None and self._latest < 1.0:
            # A mix not decided yet starts where the last decision left off:
            # when speculation lost in another mix (a batch of four whose row
            # ended, leaving two), it goes off and its probes turn it on if it
            # pays, instead of a fresh trial that a short batch never ends.
            now.active, now.steps, now.retry = False, 0, self.retry_every
            now.calibration = before.calibration
        now.steps += 1
        if not now.active:
            if now.steps < now.retry or self._unmeasured:
                return False
            now.steps = 0
            return not self._drafts_would_lose(now)
        if now.spec and len(now.plain) < self.min_plain:
            return False
        # The first plain steps of a mix can be slow for reasons of their own
        # (a kernel's first compile): two more soon, so the median is a warm one.
        if len(now.plain) < 2 * self.min_plain:
            return now.steps % 4 not in (2, 3)
        return not self._probes_plain(now.steps)

    def _probes_plain(self, steps: int) -> bool:
        """Whether this step is one of the two plain steps that keep the
        baseline current (one step in ``probe_every`` in all). Two in a row:
        the batch records a plain step only when the one before was plain
        too (``SpeculativeGenerator._plain_ahead``), since the first of a run
        also pays for leaving speculation (the cache's rolled-back
        positions, the step queued ahead), which is not what plain decoding
        costs."""
        return steps % (2 * self.probe_every) in (0, 1)

    def _drafts_would_lose(self, mix: _Mix) -> bool:
        """At an off mix's probe: whether the drafts' shadow since the last
        probe says it would lose (``probe_at``). A verify step a row emitted
        ``ratio`` tokens and speculation ran at ``speedup`` of plain then;
        its cost a step being the same, it would run at ``speedup`` scaled
        by what a verify step would emit now over ``ratio``. The shadow
        starts again from here, unless it holds too few tokens to tell:
        then the next interval's check decides, on more of them (one row
        sees 8 tokens in the first interval after turning off, and probed
        blind there)."""
        if mix.calibration is None or not self._shadowed:
            mix.shadow_seen = mix.shadow_kept = 0
            return False
        if mix.shadow_seen < self.min_shadow:
            return True
        seen, kept = mix.shadow_seen, mix.shadow_kept
        mix.shadow_seen = mix.shadow_kept = 0
        speedup, ratio = mix.calibration
        would_emit = seen / max(1, seen - kept)
        return speedup * would_emit / ratio < self.probe_at

    def shadow(self, seen: int, kept: int) -> None:
        """The step just chosen was plain: ``seen`` tokens, of which the
        drafts prompt lookup would have made had ``kept`` (``ShadowDraft``)."""
        self._shadowed = True
        if not self._now.active:
            self._now.shadow_seen += seen
            self._now.shadow_kept += kept

    def joined(self) -> None:
        """Requests joined the batch: what pays may have changed, so an off
        mix probes within ``retry_every`` steps, once (not again if it
        probed that recently), its backoff kept. The next step also takes
        the new rows in (their caches merged, the step computed ahead
        emitted first), which is not what speculation or plain decoding
        cost: it is not measured, and never a probe."""
        for mix in self._mixes.values():
            if not mix.active:
                # The shadow is of the rows before: the probe weighs the new ones'.
                mix.shadow_seen = mix.shadow_kept = 0
                if mix.steps >= self.retry_every:
                    mix.steps = max(mix.steps, mix.retry - self.retry_every)
        self._joining = True

    def record(self, speculative: bool, tokens: int, seconds: float, leaving: bool = False) -> None:
        """What the step just chosen did: ``speculative`` if some row verified
        drafts, the tokens all rows emitted and the seconds it took.
        ``leaving``: the first plain step after a verify step, which also
        pays for leaving it (see ``_probes_plain``); the batch sends it as
        speculative. While off, it is part of the probe it follows: a probe
        is judged once the step after it is in, with that step's cost if it
        is its leaving step. Judged apart, every leaving step read as a
        losing probe of its own, and the last two samples that turn
        speculation back on were one probe and its leaving step, so one
        lucky probe did it."""
        if seconds <= 0 or tokens <= 0:
            return
        if self._unmeasured:
            self._unmeasured = False
            return
        now = self._now
        probed, self._probed = self._probed, None
        if probed is not None:
            if leaving and probed is now and now.spec:
                probe_tokens, probe_seconds = now.spec[-1]
                now.spec[-1] = (probe_tokens + tokens, probe_seconds + seconds)
                self._judge_probe(now)
                return
            self._judge_probe(probed)
        if leaving and not now.active:
            # Off, a leaving step that follows no probe leaves the verify
            # step that turned speculation off: no probe's cost.
            return
        (now.spec if speculative else now.plain).append((tokens, seconds))
        if speculative and not leaving:
            if now.active:
                now.verified_tokens += tokens
                now.verified_rows += self._rows
            else:
                now.probe_ratio = tokens / self._rows
        if len(now.plain) < self.min_plain or not now.spec:
            return
        if now.active:
            if len(now.spec) < self.min_spec:
                return
            now.speedup = self._latest = _spec_rate(now.spec) / _rate(now.plain)
            if now.speedup < 1.0 and not self.hold_on:
                now.active, now.steps, now.retry = False, 0, self.retry_every
                if now.verified_rows:
                    now.calibration = (now.speedup, now.verified_tokens / now.verified_rows)
                now.verified_tokens = now.verified_rows = 0
                # Off: what it measures from now on are the probes.
                now.spec.clear()
            return
        if not speculative:
            return
        # A probe: its interval to the next one now, whether it turns
        # speculation back on when the next step is in.
        now.retry_before_probe, self._probed = now.retry, now
        now.retry = self._interval_after(now)

    def _interval_after(self, mix: _Mix) -> int:
        """A probe that pays brings the next within ``retry_every`` steps;
        one that loses doubles the interval, up to ``max_retry``."""
        latest = _spec_rate([mix.spec[-1]]) / _rate(mix.plain)
        return self.retry_every if latest >= 1.0 else min(self.max_retry, mix.retry_before_probe * 2)

    def _judge_probe(self, mix: _Mix) -> None:
        """An off mix's last probe, with its leaving step if one came: the
        interval to the next, and whether the last ``retry_samples`` probes
        pay together (back on)."""
        mix.retry = self._interval_after(mix)
        if mix.probe_ratio:
            mix.calibration = (_spec_rate([mix.spec[-1]]) / _rate(mix.plain), mix.probe_ratio)
        if len(mix.spec) < self.retry_samples:
            return
        recent = list(mix.spec)[-self.retry_samples :]
        mix.speedup = self._latest = _spec_rate(recent) / _rate(mix.plain)
        if mix.speedup >= 1.0:
            mix.active, mix.steps = True, 0
            mix.spec.clear()
            mix.spec.extend(recent)


def _rate(records: Iterable[tuple[int, float]]) -> float:
    """Plain steps' tokens a second: the median of the steps', so that a step
    that ran slow for reasons of its own (the first use of a kernel shape,
    the machine busy) does not decide alone. A plain step emits one token a
    row, so each step's rate is the batch's."""
    return statistics.median(t / s for t, s in records)


def _spec_rate(records: Iterable[tuple[int, float]]) -> float:
    """Speculative steps' tokens a second: all their tokens over all their
    time, each step's time capped at twice the median step's (a slow one
    does not decide alone either). Not the median of each step's rate: a
    speculative step keeps one token or five, and three steps that kept 1,
    3 and 1 tokens in about the same time made the median the one-token
    rate, below plain decoding, where the three together beat it. A code
    edit's first run turned speculation off so, on this project's CPU and on
    an H100 (bench/speculative.py prints where the governor stood after each
    run)."""
    records = list(records)
    cap = 2 * statistics.median(s for _, s in records)
    return sum(t for t, _ in records) / sum(min(s, cap) for _, s in records)
