"""The attempts loop of a failover entry: its targets tried in the order the
choice picked (``choice.order``), each started by the caller's ``start_on``,
the next one tried after a failure that lets it (``choice.falls_through``),
before any output reached the client. Kept apart from the I/O it drives, so
it is tested with plain coroutines."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from mlxd.errors import MlxdError, ServiceUnavailable
from mlxd.failover.choice import falls_through

T = TypeVar("T")
# A target as the caller names it (the request path: its ModelSpec).
Target = TypeVar("Target")


async def first_that_starts(
    order: Sequence[Target],
    start_on: Callable[[Target], Awaitable[T]],
    *,
    time_left: Callable[[], float],
    fell_through: Callable[[Target, MlxdError, Target], None],
    name: str,
) -> T:
    """What ``start_on`` gives for the first target of ``order`` that starts.
    A failure on the last target, one that does not fall through, or one
    after the request's time ran out is raised as itself; before each next
    try ``fell_through(target, error, next_target)`` is told (for the
    router's figures, the metric and the log)."""
    if not order:
        raise ServiceUnavailable(f"No target of `{name}` can take this request now", retry_after=1)
    for position, target in enumerate(order):
        try:
            return await start_on(target)
        except MlxdError as failure:
            if position == len(order) - 1 or not falls_through(failure) or time_left() <= 0:
                raise
            fell_through(target, failure, order[position + 1])
    raise AssertionError("unreachable: the last target raises")
