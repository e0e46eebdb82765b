"""Which of a failover entry's targets to try, in what order, and which
failures let the next one try: pure functions of plain values (no clock, no
I/O), so every case is a row of a table test. ``router.py`` reads the values
from residency and the backend poll."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxd.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    CapacityUnavailable,
    ModelLoadFailed,
    NotForThisModel,
    QueueFull,
    UpstreamRejected,
)


@dataclass(frozen=True)
class Target:
    name: str
    # Where it runs: "local" (a model of this daemon), or the kind of the
    # backend serving it: "mlxd" or "openai".
    kind: str
    # local: its residency state ("loaded", "loading", "unloaded", "failed",
    # ...); mlxd: the state the backend's /v1/status gave for the model at the
    # last poll (None: not listed); openai: None (such servers say nothing).
    state: str | None
    # Remote: whether the backend answered its last poll (None: not polled yet).
    reachable: bool | None
    # Requests it serves now, requests waiting for it, and how many it may
    # serve at once (a remote target's are its backend's, shared).
    busy: int
    waiting: int
    capacity: int

    @property
    def warm(self) -> bool:
        """It has the model loaded. An OpenAI server (vLLM, SGLang) serves
        only models it has loaded, so one that answers is warm."""
        if self.kind == "openai":
            return self.reachable is True
        return self.state == "loaded"

    @property
    def full(self) -> bool:
        return self.busy + self.waiting >= self.capacity

    @property
    def down(self) -> bool:
        # A model that failed to load, here or on an mlxd backend, fails the
        # same way until its file or settings change: trying it first would
        # cost every request a round trip before the next target.
        return self.state == "failed" or (self.kind != "local" and self.reachable is False)


def order(strategy: str, targets: Sequence[Target]) -> list[str]:
    """The targets to try, best first. ``warm`` puts those that have the model
    loaded first, ``spillover`` those with a free slot; among equals the file's
    order holds. A target that looks down goes last rather than away: the
    poll may be stale, and when every target is down one of them must answer."""

    def rank(item: tuple[int, Target]) -> tuple[bool, bool, int]:
        position, target = item
        worse = not target.warm if strategy == "warm" else target.full
        return target.down, worse, position

    return [target.name for _, target in sorted(enumerate(targets), key=rank)]


# A target that failed with one of these took nothing from the request: it
# could not take it now (down, refusing, full, out of memory, silent).
_PASSES = (BackendUnavailable, BackendFailed, BackendTimeout, QueueFull, ModelLoadFailed, CapacityUnavailable,
           NotForThisModel)


def falls_through(error: BaseException) -> bool:
    """Whether the next target may try after ``error``, raised before any
    output reached the client. What says the request itself is wrong (a 4xx
    of the backend's, a bad image) would fail the same way everywhere, and
    the request's own deadline passing leaves nothing to try with."""
    if isinstance(error, UpstreamRejected):
        return error.status_code == 429  # the backend's queue is full
    return isinstance(error, _PASSES)
