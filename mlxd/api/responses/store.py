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
    """Each response is kept with its owner (the caller's name: its app, or
    its key's name), and only its owner continues it: another app's
    ``previous_response_id`` is not found, as an unknown one is."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, tuple[Message, ...]]] = OrderedDict()

    def put(self, response_id: str, owner: str, conversation: tuple[Message, ...]) -> None:
        """``conversation``: every message up to and including the response's
        own output, without the request's instructions (they do not carry over)."""
        with self._lock:
            self._items[response_id] = (owner, conversation)
            while len(self._items) > self._keep:
                self._items.popitem(last=False)

    def get(self, response_id: str, owner: str) -> tuple[Message, ...] | None:
        with self._lock:
            found = self._items.get(response_id)
        return found[1] if found is not None and found[0] == owner else None

    def __len__(self) -> int:
        return len(self._items)
