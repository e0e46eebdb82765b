"""Priority classes in the fair queue, as a pure core over plain values:
which waiting request of a model gets the next free lease.

- Weighted admission: between the classes waiting for one model, stride
  scheduling (each pick advances its class's pass by 1/weight; the smallest
  pass goes next), so under sustained contention interactive, default and
  bulk requests are admitted 8 : 4 : 1. Queued bulk work yields to
  interactive work, and still gets its share: nothing starves.
- A class that was not waiting joins at the queue's virtual time: a class
  that idled banks no credit to burst with later.
- A reserved interactive slot per model: while any app is interactive, a
  model admitting two or more leases at once keeps its last free one for
  interactive requests, so an interactive request never waits behind a
  model that bulk work has filled.
- Within a class: first come, first served.

No clock, no I/O: the residency core asks it and tests replay it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

PRIORITIES = ("interactive", "default", "bulk")
WEIGHTS = {"interactive": 8.0, "default": 4.0, "bulk": 1.0}


class Waiting(Protocol):
    priority: str
    arrived: float


def class_of(priority: str) -> str:
    return priority if priority in WEIGHTS else "default"


@dataclass
class FairShare:
    """Each queue's (a model's) class passes."""

    reserve_interactive: bool = False
    _passes: dict[str, dict[str, float]] = field(default_factory=dict)
    _now: dict[str, float] = field(default_factory=dict)

    def pick(self, queue: str, waiting: Sequence[Waiting], active: int, capacity: int) -> Waiting | None:
        """The waiter of ``queue`` to admit to a free lease, or None when the
        only free lease is reserved and none of them is interactive.
        ``waiting`` in arrival order; ``active`` leases of ``capacity`` held."""
        if not waiting:
            return None
        reserved = self.reserve_interactive and capacity >= 2 and active >= capacity - 1
        heads: dict[str, Waiting] = {}
        for w in waiting:
            c = class_of(w.priority)
            if c not in heads and (not reserved or c == "interactive"):
                heads[c] = w
        if not heads:
            return None
        passes = self._passes.setdefault(queue, {})
        # The queue's virtual time: the pass of the class picked last (a
        # class waiting all along is at or past it). A class that was not
        # waiting joins one of its own strides past it, as if it had just
        # been served: no credit from its idle time, no jump ahead of work
        # that was already waiting.
        now = self._now.get(queue, 0.0)
        for c in heads:
            if passes.get(c, -1.0) < now:
                passes[c] = now + 1.0 / WEIGHTS[c]
        chosen = min(heads, key=lambda c: (passes[c], PRIORITIES.index(c)))
        self._now[queue] = passes[chosen]
        passes[chosen] += 1.0 / WEIGHTS[chosen]
        return heads[chosen]
