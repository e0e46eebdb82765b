"""Recent responses, so a request can continue one by ``previous_response_id``.

Bounded and in memory only: the oldest response goes when the store is
full, and none survives a restart. A client that needs more keeps its own
history and sends it (``store: false`` is the stateless way, what Codex does).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from mlxd.api.conversation import Message

# Responses kept. Each holds its whole conversation (text only, no images read).
KEEP = 256


class ResponseStore:
    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[Message, ...]] = OrderedDict()

    def put(self, response_id: str, conversation: tuple[Message, ...]) -> None:
        """``conversation``: every message up to and including the response's
        own output, without the request's instructions (they do not carry over)."""
        with self._lock:
            self._items[response_id] = conversation
            while len(self._items) > self._keep:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[Message, ...] | None:
        with self._lock:
            return self._items.get(response_id)

    def __len__(self) -> int:
        return len(self._items)
