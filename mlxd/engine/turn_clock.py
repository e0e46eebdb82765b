"""Which turns of a batch loop ran long, and where their time went.

A request's time to first token and a stream's gaps are set by the turns of
its model's batch loop (``engine/batch.py``): one decode step for every row,
and between steps the admissions, prefill chunks, joins and endings. A turn
that takes several times the usual one is what a tail latency is made of,
and which phase it spent its time in says why (a join's cache merge, an
ending's cache hand-over, a prefill chunk). At debug level the batch logs
each such turn with its phases; nothing is timed otherwise. Given the
thread's CPU time too, each phase says how much of it the thread worked
(``step 52.0 (cpu 4.1)``: it mostly waited, for the accelerator or for the
GIL, which the event loop holds while it serves requests). The converse
does not hold on CUDA: with one context on a many-core host the CUDA
runtime waits for the device by spinning, so a wait counts as CPU time
(every step timed on an H100 had CPU equal to wall, steady ones included).

Pure: the caller passes the clock's readings.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

# A turn is slow past this many times the median of the recent ones...
SLOW_FACTOR = 2.0
# ...and past this many seconds (a turn of a tiny model on an idle batch is
# well under a millisecond; twice that is not worth a line).
SLOW_FLOOR_S = 0.004
WINDOW = 128


def _slow(recent: collections.deque[float], total: float, factor: float, floor_s: float) -> float | None:
    """The usual figure (the median of the recent ones) when ``total`` is
    slow against it and past the floor, else None; ``total`` then joins
    the recent ones. No verdict before there are enough to go on."""
    usual = statistics.median(recent) if len(recent) >= 8 else None
    recent.append(total)
    if usual is None or total < floor_s or total < factor * usual:
        return None
    return usual


@dataclass
class TurnClock:
    factor: float = SLOW_FACTOR
    floor_s: float = SLOW_FLOOR_S
    recent: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))
    _started: float = 0.0
    _last: float = 0.0
    _last_cpu: float | None = None
    _phases: dict[str, float] = field(default_factory=dict)
    _cpu: dict[str, float] = field(default_factory=dict)

    def start(self, now: float, cpu: float | None = None) -> None:
        """``cpu``: the thread's CPU time (``time.thread_time``), if the
        phases should say how much of their time the thread itself worked:
        the rest it waited, on the accelerator or for the GIL."""
        self._started = self._last = now
        self._last_cpu = cpu
        self._phases = {}
        self._cpu = {}

    def mark(self, phase: str, now: float, cpu: float | None = None) -> None:
        """The time since the previous mark (or the start) was ``phase``'s."""
        self._phases[phase] = self._phases.get(phase, 0.0) + now - self._last
        self._last = now
        if cpu is not None and self._last_cpu is not None:
            self._cpu[phase] = self._cpu.get(phase, 0.0) + cpu - self._last_cpu
            self._last_cpu = cpu

    def end(self, now: float, **counts: int) -> str | None:
        """The turn's description when it was slow (its phases in ms, and
        ``counts``: rows, arrivals, joins...), else None. Every turn counts
        toward the median the next ones are held to."""
        total = now - self._started
        usual = _slow(self.recent, total, self.factor, self.floor_s)
        if usual is None:
            return None
        phases = ", ".join(f"{name} {1000 * s:.1f}" + (f" (cpu {1000 * self._cpu[name]:.1f})" if name in self._cpu else "")
                           for name, s in self._phases.items() if s >= 0.0005)
        detail = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
        return f"slow turn {1000 * total:.1f} ms (usual {1000 * usual:.1f}): {phases}" + (f"; {detail}" if detail else "")


# A request's way to its first text, in the order the batch loop stamps it
# (engine/batch.py): each phase is the time since the stamp before it.
FIRST_TEXT_PHASES = (
    ("admitted", "waited for the turn"),
    ("prepared", "admit"),
    ("prefilled", "prefill"),
    ("drawn", "first tokens"),
    ("out", "to the batch's step"),
)


@dataclass
class FirstTextClock:
    """Which requests' first text came late, and where their time went: the
    wait for the turn in progress when they arrived (and which turn that
    was), their admission (template, tokens, the prefix cache's copy), their
    prompt's prefill, the tokens drawn on their own and, for a bulk request
    joining a decoding batch or a first token without text, the batch's
    step. Pure, as ``TurnClock``: the caller passes the stamps."""

    factor: float = SLOW_FACTOR
    floor_s: float = SLOW_FLOOR_S
    recent: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=WINDOW))

    def end(self, stamps: dict[str, float], label: str, detail: str = "") -> str | None:
        """The request's description when its first text was slow (its
        phases in ms, ``label`` and ``detail``), else None. ``stamps`` holds
        ``submitted`` and ``out`` and the phases' stamps it passed through.
        Only the engine's part: a client's time to first token adds HTTP and
        the event loop's hand-over."""
        total = stamps["out"] - stamps["submitted"]
        usual = _slow(self.recent, total, self.factor, self.floor_s)
        if usual is None:
            return None
        parts, last = [], stamps["submitted"]
        for stamp, phase in FIRST_TEXT_PHASES:
            if stamp in stamps:
                if stamps[stamp] - last >= 0.0005:
                    parts.append(f"{phase} {1000 * (stamps[stamp] - last):.1f}")
                last = stamps[stamp]
        return (f"slow first text {1000 * total:.1f} ms (usual {1000 * usual:.1f}), {label}: "
                + ", ".join(parts) + (f"; {detail}" if detail else ""))
