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
  model that bulk work has filled. A request that needs every slot (its
  ``n`` choices) could never fit beside the kept one: it is let in once the
  model is idle (an interactive request may then take it back before its
  first byte, if it is bulk).
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
    slots: int


def class_of(priority: str) -> str:
    return priority if priority in WEIGHTS else "default"


@dataclass
class FairShare:
    """Each queue's (a model's) class passes."""

    reserve_interactive: bool = False
    _passes: dict[str, dict[str, float]] = field(default_factory=dict)
    _now: dict[str, float] = field(default_factory=dict)

    def choose(self, queue: str, waiting: Sequence[Waiting], active: int, capacity: int) -> Waiting | None:
        """The waiter of ``queue`` next in line for a free lease, or None when
        the only free lease is kept and none of them is interactive.
        ``waiting`` in arrival order; ``active`` slots of ``capacity`` held.
        Choosing changes nothing but a joining class's pass (``served`` moves
        the queue on), so a choice that must wait can be asked again."""
        if not waiting:
            return None
        # Each class's first waiter: one that would take the kept slot holds
        # its class back (the ones behind it do not jump it).
        firsts: dict[str, Waiting] = {}
        for w in waiting:
            firsts.setdefault(class_of(w.priority), w)
        heads = {c: w for c, w in firsts.items() if c == "interactive" or not self._kept(active, w.slots, capacity)}
        if not heads:
            return None
        passes = self._passes.setdefault(queue, {})
        # The queue's virtual time: the pass of the class served last (a
        # class waiting all along is at or past it). A class that was not
        # waiting joins one of its own strides past it, as if it had just
        # been served: no credit from its idle time, no jump ahead of work
        # that was already waiting.
        now = self._now.get(queue, 0.0)
        for c in heads:
            if passes.get(c, -1.0) < now:
                passes[c] = now + 1.0 / WEIGHTS[c]
        chosen = min(heads, key=lambda c: (passes[c], PRIORITIES.index(c)))
        return heads[chosen]

    def served(self, queue: str, priority: str) -> None:
        """A waiter of ``priority`` was granted its lease."""
        c = class_of(priority)
        passes = self._passes.setdefault(queue, {})
        pass_ = passes.get(c, self._now.get(queue, 0.0))
        self._now[queue] = pass_
        passes[c] = pass_ + 1.0 / WEIGHTS[c]

    def _kept(self, active: int, slots: int, capacity: int) -> bool:
        """Whether ``slots`` more beside ``active`` would take the one kept for
        interactive requests (all of an idle model's are not kept from a
        request that needs them all: it would never run)."""
        if not self.reserve_interactive or capacity < 2 or (active == 0 and slots >= capacity):
            return False
        return active + slots > capacity - 1
