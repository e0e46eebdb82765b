"""Victim choice: which loaded models give up their memory, and in what order.

Pure functions over plain values: a :class:`Candidate` per loaded model, a
number of bytes needed and a number already available. They decide and
nothing else; the core (``residency.core``) carries the choice out and says
why. Tested as a table in tests/residency/test_eviction.py.

The one ordering rule everywhere: least recently used first. Pinned models
are never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """A loaded model that could be asked to leave."""

    name: str
    nbytes: int
    last_used: float
    busy: bool = False  # holds at least one lease
    pinned: bool = False


@dataclass(frozen=True)
class Preemption:
    """Idle models to unload at once and busy ones to abort and drain."""

    evict: tuple[str, ...]
    drain: tuple[str, ...]


def _lru(candidates: Iterable[Candidate], *, busy: bool) -> list[Candidate]:
    eligible = [c for c in candidates if not c.pinned and c.busy is busy]
    return sorted(eligible, key=lambda c: c.last_used)


def _take(need: int, available: int, ordered: list[Candidate]) -> tuple[list[Candidate], int]:
    """The shortest prefix of ``ordered`` that brings ``available`` up to ``need``."""
    chosen: list[Candidate] = []
    for candidate in ordered:
        if available >= need:
            break
        chosen.append(candidate)
        available += candidate.nbytes
    return chosen, available


def _names(chosen: Iterable[Candidate]) -> tuple[str, ...]:
    return tuple(c.name for c in chosen)


def to_fit_budget(over: int, candidates: Iterable[Candidate]) -> tuple[str, ...]:
    """Idle models to unload when committed memory is ``over`` the budget
    (it shrank, or a model measured larger than estimated). Not all or
    nothing: when the idle models cannot cover it, each one still helps."""
    chosen, _ = _take(over, 0, _lru(candidates, busy=False))
    return _names(chosen)


def to_make_room(need: int, available: int, candidates: Iterable[Candidate]) -> tuple[str, ...] | None:
    """Idle models to evict so ``need`` bytes fit, given ``available`` (free
    plus what is already on its way out). All or nothing: None when evicting
    every idle model would still not be enough, so nothing is evicted in vain."""
    chosen, covered = _take(need, available, _lru(candidates, busy=False))
    return _names(chosen) if covered >= need else None


def to_preempt(need: int, available: int, candidates: Iterable[Candidate]) -> Preemption | None:
    """Preemption: every idle model goes, then busy ones, least recently used
    first, until ``need`` fits. None when even that would not be enough."""
    idle = _lru(candidates, busy=False)
    busy, covered = _take(need, available + sum(c.nbytes for c in idle), _lru(candidates, busy=True))
    if covered < need:
        return None
    return Preemption(evict=_names(idle), drain=_names(busy))


def to_pass_over(need: int, available: int, candidates: Iterable[Candidate]) -> tuple[str, ...] | None:
    """Fairness for a request passed over too long: busy models to drain
    (stop admitting, unload once idle) so ``need`` fits. The idle models'
    bytes count as reachable (eviction takes them once the drains have made
    the plan whole), so no more busy models stop than needed. None when
    draining cannot make it fit or nothing needs draining."""
    idle = sum(c.nbytes for c in _lru(candidates, busy=False))
    chosen, covered = _take(need, available + idle, _lru(candidates, busy=True))
    return _names(chosen) if chosen and covered >= need else None
