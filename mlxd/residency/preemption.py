"""Preemption before the first byte, as a pure core over plain values: which
held leases give way to interactive requests waiting for their model.

A bulk request whose lease is held but that has sent nothing yet (queued
in its engine or in prefill) may hand its slot to an interactive request
and wait again, first of its class: its client sees only latency. The
request path says when a lease may be taken back (``preemptable``, set
while nothing was sent, cleared for good at the first byte); a request
that has sent anything is never preempted.

- Only bulk leases give way, and only to interactive waiters.
- Each interactive waiter is promised at most one lease, and each lease is
  taken back for one waiter: a preemption in flight is not repeated.
- The smallest lease that frees enough slots goes first (a request's ``n``
  choices hold one lease of several slots and are taken back together:
  every one of them starts over), and among those the lease granted last:
  it has done the least prefill.

No clock, no I/O: the residency core asks it and tests replay it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mlxd.caller import class_of
from mlxd.residency.priority import Waiting


@dataclass
class Holder:
    """A granted lease, as preemption sees it."""

    request_id: int
    model: str
    instance: int
    priority: str
    slots: int
    arrived: float  # when its request first asked: it waits again from there
    granted: float
    preemptable: bool = False
    # The interactive waiter this lease was taken back for (a preemption in flight).
    preempted_for: int | None = None


class WaitingRequest(Waiting, Protocol):
    request_id: int


def to_preempt_leases(holders: Sequence[Holder], waiting: Sequence[WaitingRequest]) -> list[tuple[Holder, int]]:
    """(lease to take back, waiter's request id) pairs for one full model:
    ``holders`` its leases, ``waiting`` its waiters in arrival order."""
    promised = {h.preempted_for for h in holders if h.preempted_for is not None}
    wanting = [
        w for w in waiting if class_of(w.priority) == "interactive" and w.request_id not in promised
    ]
    victims = sorted(
        (h for h in holders if h.preemptable and h.preempted_for is None and class_of(h.priority) == "bulk"),
        key=lambda h: (h.slots, -h.granted),
    )
    pairs: list[tuple[Holder, int]] = []
    for w in wanting:
        victim = next((h for h in victims if h.slots >= w.slots), None)
        if victim is None:
            continue
        victims.remove(victim)
        pairs.append((victim, w.request_id))
    return pairs
