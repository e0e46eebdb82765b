"""Waiting on an event with a time limit, without losing a cancellation.

Before Python 3.12, ``asyncio.wait_for`` swallows a cancellation that
arrives in the same loop turn as the awaited thing finishing (CPython
gh-86296): a background loop cancelled just as it was woken would carry on
and wait forever, and whoever awaited its end hung with it (the residency
timer did, holding a daemon's shutdown for a minute).
"""

from __future__ import annotations

import asyncio


async def event_set_within(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait up to ``timeout`` seconds (None: no limit) for ``event``; whether it was set."""
    if timeout is None:
        await event.wait()
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        # asyncio.wait never swallows the caller's cancellation.
        await asyncio.wait({waiter}, timeout=max(0.0, timeout))
    finally:
        waiter.cancel()
    return event.is_set()
