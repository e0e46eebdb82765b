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

from mlxd.caller import Stride, class_of


class Waiting(Protocol):
    priority: str
    arrived: float
    slots: int


@dataclass
class FairShare:
    """Each queue's (a model's) class passes."""

    reserve_interactive: bool = False
    _strides: dict[str, Stride] = field(default_factory=dict)

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
        chosen = self._strides.setdefault(queue, Stride()).pick(heads)
        return heads[chosen] if chosen is not None else None

    def served(self, queue: str, priority: str) -> None:
        """A waiter of ``priority`` was granted its lease."""
        self._strides.setdefault(queue, Stride()).served(priority)

    def _kept(self, active: int, slots: int, capacity: int) -> bool:
        """Whether ``slots`` more beside ``active`` would take the one kept for
        interactive requests (all of an idle model's are not kept from a
        request that needs them all: it would never run)."""
        if not self.reserve_interactive or capacity < 2 or (active == 0 and slots >= capacity):
            return False
        return active + slots > capacity - 1
