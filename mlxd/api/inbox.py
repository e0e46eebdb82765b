"""The queue between a stream's producer (engine chunks, heartbeat ticks)
and the task that writes its frames.

asyncio.Queue does more than a stream needs (bounds, putters, task counts,
a future per get); this is a deque and at most one waiting reader, which
matters when every token passes through it. Event loop only.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any


class StreamInbox:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> Any:
        return self._items.popleft()

    async def get(self) -> Any:
        """The next item, waiting for one. One reader at a time."""
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return items.popleft()
