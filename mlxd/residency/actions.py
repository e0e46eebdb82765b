"""What the residency core decides: the actions its shell carries out
(``residency/shell.py``). Plain frozen values; the core's module
re-exports them."""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.errors import MlxdError


@dataclass(frozen=True)
class StartLoad:
    model: str
    instance: int


# Why a model unloads, as one word of a small fixed set (a metric's label;
# ``reason`` is the sentence): a drain's cause (``state.DrainCause``) or one of these.
IDLE, EVICTED, BUDGET = "idle", "evicted", "budget"


@dataclass(frozen=True)
class StartUnload:
    model: str
    instance: int
    reason: str
    cause: str = IDLE

    @property
    def evicted(self) -> bool:
        """Unloaded to make room for another model (LRU eviction), not for itself."""
        return self.cause == EVICTED


@dataclass(frozen=True)
class AbortGenerations:
    model: str
    instance: int
    reason: str


@dataclass(frozen=True)
class Grant:
    request_id: int
    model: str
    instance: int
    # False for an admin load: the model is ready, but no lease was taken.
    takes_lease: bool = True
    # Slots of max_concurrency the lease holds (``n`` choices run at once).
    slots: int = 1


@dataclass(frozen=True)
class Reject:
    request_id: int
    error: MlxdError


@dataclass(frozen=True)
class Note:
    """A decision worth showing an operator, with its reason."""

    kind: str
    model: str
    message: str


@dataclass(frozen=True)
class PreemptLease:
    """Ask the request holding lease ``request_id`` (a bulk one that has sent
    nothing yet) to stop, give its lease back and wait again at the head of
    its class: an interactive request waits for the slot."""

    request_id: int
    model: str
    instance: int
    reason: str


Action = StartLoad | StartUnload | AbortGenerations | Grant | Reject | Note | PreemptLease
