"""How often an encoder may run a pass while a model decodes on the same
device, so that the decoding streams keep their pace: a pure core fed clock
readings (no MLX, no clock, no threads), and the lock around it.

Embedding clients are closed loops: each sends its next request as soon as
the last is answered, so eight of them take whatever the machine gives. What
they take is not only the device: on a GPU host it is the GIL and the host's
time that the decode steps' graphs are built in (a 7B-shaped chat model on an
H100 beside 8 clients kept 0.75 of its solo tokens/s, though its steps wait
on its weights), on a CPU it is the cores. Which it is varies by machine, so
the keeper measures what the passes cost the decode steps instead of
guessing it:

- a *period* is the time between two steady decode steps of one batch (no
  row joined, left or was prefilled in between): what a stream's reader
  waits between two tokens. It is *clean* when no pass ran during it (none
  started, none in flight) and no encoder request arrived in it (the event
  loop's work on one weighs on the steps as well). Periods are kept per mix
  (the batch's rows, to a power of two, as the speculative governor keeps
  them): a batch of 4 steps slower than one of 1 for reasons of its own;
- every ``hold_every`` steady steps the passes are held for ``hold_steps``
  steps, so the clean figure (their median) stays current: a batch's pace
  moves with its context;
- the *slowdown* is the mean of the periods since the last decision, clean
  and not, over the clean periods' mean (outliers left out), less one: what
  the streams' tokens/s lose. Over ``tolerance`` the pause from the end of one pass to the start
  of the next doubles (from ``min_pause_s`` to ``max_pause_s``); within
  half of it, the pause halves, and below ``min_pause_s`` there is none. A
  decision waits for ``min_samples`` periods and for periods spanning two
  pauses, so that a long pause is judged on periods with passes in them;
- ``max_pause_s`` bounds what a pass waits: embedding requests are slowed
  while a model decodes, never starved;
- with no step for ``idle_s``, nothing decodes: passes run at once.

What the keeper does not bound is one period's length: a pass run on the
worker between two steps (a CPU's) lengthens that period by its own
length, however rare the passes are.
"""

from __future__ import annotations

import collections
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine.speculative_governor import mix_of


@dataclass
class _Periods:
    window: int
    clean: collections.deque[float] = field(init=False)
    every: collections.deque[float] = field(init=False)  # clean or not: how long a step takes now
    recent: list[float] = field(default_factory=list)  # since the last decision, holds left out

    def __post_init__(self) -> None:
        self.clean = collections.deque(maxlen=self.window)
        self.every = collections.deque(maxlen=self.window)


class PaceKeeper:
    """The pure core. ``now`` is one monotonic clock shared by every caller."""

    def __init__(self, tolerance: float = 0.05, hold_every: int = 64, hold_steps: int = 3,
                 min_pause_s: float = 0.002, max_pause_s: float = 1.0, idle_s: float = 0.5,
                 window: int = 16, min_samples: int = 8) -> None:
        self.tolerance = tolerance
        self.hold_every = max(hold_steps + 1, hold_every)
        self.hold_steps = max(2, hold_steps)
        self.min_pause_s = min_pause_s
        self.max_pause_s = max(min_pause_s, max_pause_s)
        self.idle_s = idle_s
        self.window = window
        self.min_samples = max(1, min_samples)
        self.pause_s = 0.0
        self.slowdown: float | None = None  # the recent periods' mean over the clean ones', less 1
        self.periods = 0  # steady periods measured
        self._mixes: dict[int, _Periods] = {}
        self._mix = 0
        self._last_step: float | None = None  # the last steady step's end, if the chain holds
        self._last_seen = float("-inf")  # the last step of any kind
        self._urgency = 1  # the last step's most urgent row's class
        self._steady = 0  # steady steps since the last hold began
        self._held = 0  # steps of the current hold still to come
        self._hold_began = 0.0
        self._passing = 0  # passes begun and not ended
        self._pass_seen = float("-inf")  # the last moment encoder work touched the steps
        self._pass_ended = float("-inf")  # what the pause runs from

    # --- the decoding batch's side ---------------------------------------------

    def step(self, now: float, rows: int, steady: bool, urgency: int = 1) -> None:
        """A decode step of ``rows`` rows ended at ``now``; ``steady``: no
        row joined, left or was prefilled since the step before;
        ``urgency``: its most urgent row's class (mlxd.caller.urgency)."""
        self._last_seen = now
        self._urgency = urgency
        mix = mix_of(max(1, rows))
        previous, self._last_step = self._last_step, now
        if not steady or previous is None or mix != self._mix:
            self._mix = mix
            return
        periods = self._mixes.get(mix)
        if periods is None:
            periods = self._mixes[mix] = _Periods(self.window)
        clean = not self._passing and self._pass_seen < previous
        period = now - previous
        self.periods += 1
        periods.every.append(period)
        if clean:
            periods.clean.append(period)
        if self._held:
            self._held -= 1
            if not self._held and len(periods.clean) < self.min_samples:
                self._held = self.hold_steps  # the clean figure is not known yet: no pass until it is
                self._hold_began = now
        else:
            periods.recent.append(period)
            self._steady += 1
            if self._steady >= self.hold_every or len(periods.clean) < self.min_samples:
                self._steady, self._held, self._hold_began = 0, self.hold_steps, now
        self._decide(periods)

    def _decide(self, periods: _Periods) -> None:
        recent = periods.recent
        if len(periods.clean) < self.min_samples or len(recent) < self.min_samples or sum(recent) < 2 * self.pause_s:
            return
        self.slowdown = statistics.fmean(recent) / _mean_without_outliers(periods.clean) - 1.0
        recent.clear()
        if self.slowdown > self.tolerance:
            self.pause_s = min(self.max_pause_s, max(self.min_pause_s, 2 * self.pause_s))
        elif self.slowdown <= self.tolerance / 2 and self.pause_s:
            self.pause_s = self.pause_s / 2 if self.pause_s / 2 >= self.min_pause_s else 0.0

    # --- the encoder's side ----------------------------------------------------

    def decoding(self, now: float) -> bool:
        return now - self._last_seen < self.idle_s

    def wait_s(self, now: float, urgency: int = 1) -> float:
        """How long the next pass, for callers of class ``urgency``, should
        wait from ``now`` (0: go). A pass is paced only for a batch holding
        a row as urgent as its callers or more: embeddings of the default
        class do not wait for bulk generations."""
        if not self.decoding(now) or urgency < self._urgency:
            return 0.0
        periods = self._mixes.get(self._mix)
        step = statistics.median(periods.every) if periods is not None and periods.every else 0.0
        # A hold lasts its steps, and no longer than they should take: a
        # batch whose periods are never clean (a pass of another engine in
        # flight all along) holds no pass for more than that.
        if self._held and now - self._hold_began < max(self.max_pause_s, (self.hold_steps + 2) * step):
            return max(self.min_pause_s, min(step, self.max_pause_s))
        if self._passing:
            return 0.0  # another engine's pass: the pause runs from the end of the last one
        return max(0.0, self._pass_ended + self.pause_s - now)

    def began(self, now: float) -> None:
        """A pass starts (run or queued on the device)."""
        self._passing += 1
        self._pass_seen = now

    def ended(self, now: float) -> None:
        """A pass is over (read back)."""
        self._passing = max(0, self._passing - 1)
        self._pass_seen = self._pass_ended = now

    def touched(self, now: float) -> None:
        """An encoder request arrived: the event loop's work on it (its
        body, its tokens, its answer) costs the steps too, so the period it
        falls in is not clean, though no pass ran in it. It does not move
        the pause on: requests arriving more often than the pause would
        hold every pass back."""
        self._pass_seen = max(self._pass_seen, now)

    def snapshot(self, now: float) -> dict[str, Any]:
        periods = self._mixes.get(self._mix)

        def ms(values: Any) -> float | None:
            return round(1000 * statistics.median(values), 3) if values else None

        return {
            "decoding": self.decoding(now),
            "step_ms": ms(periods.every) if periods else None,
            "clean_step_ms": ms(periods.clean) if periods else None,
            "pause_ms": round(1000 * self.pause_s, 3),
            "slowdown": None if self.slowdown is None else round(self.slowdown, 4),
            "held": self._held > 0,
            "periods": self.periods,
        }


def _mean_without_outliers(values: Any) -> float:
    """The mean of ``values`` but those over twice their median (a collection,
    a page fault): set against the recent periods' mean, as a median was, it
    read steps whose lengths vary (a CPU's) as slowed by about half their
    spread, passes or not."""
    median = statistics.median(values)
    return statistics.fmean(v for v in values if v <= 2 * median)


class GenerationPace:
    """The keeper behind a lock: the batch loop reports from the worker
    thread, encoders ask from the event loop (or their pass thread)."""

    def __init__(self, keeper: PaceKeeper | None = None) -> None:
        self._keeper = keeper or PaceKeeper()
        self._lock = threading.Lock()

    def step(self, now: float, rows: int, steady: bool, urgency: int = 1) -> None:
        with self._lock:
            self._keeper.step(now, rows, steady, urgency)

    def wait_s(self, now: float, urgency: int = 1) -> float:
        with self._lock:
            return self._keeper.wait_s(now, urgency)

    def began(self, now: float) -> None:
        with self._lock:
            self._keeper.began(now)

    def ended(self, now: float) -> None:
        with self._lock:
            self._keeper.ended(now)

    def touched(self, now: float) -> None:
        with self._lock:
            self._keeper.touched(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        with self._lock:
            return self._keeper.snapshot(now)
