"""Recent responses, so a request can continue one by ``previous_response_id``.

Bounded and in memory only: the oldest response goes when the store is
full, by count or by bytes, and none survives a restart. A client that
needs more keeps its own history and sends it (``store: false`` is the
stateless way, what Codex does).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from mlxd.api.conversation import Conversation, ImagePart, Message

# Responses kept. Each holds its whole conversation (text, and images as the
# URLs they came as, not read).
KEEP = 256
# And at most about this much of them: a data: URL image is megabytes, and
# 256 such conversations would hold gigabytes a client made the daemon keep.
KEEP_BYTES = 256 << 20


class ResponseStore:
    """Each response is kept with its owner (the caller's name: its app, or
    its key's name), and only its owner continues it: another app's
    ``previous_response_id`` is not found, as an unknown one is."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[str, tuple[Message, ...], int]] = OrderedDict()
        self._bytes = 0

    def put(self, response_id: str, owner: str, conversation: tuple[Message, ...]) -> None:
        """``conversation``: every message up to and including the response's
        own output, without the request's instructions (they do not carry over).
        The newest is kept even alone past the byte bound: it is the one a
        client continues next."""
        weight = _weight(conversation)
        with self._lock:
            old = self._items.pop(response_id, None)
            self._bytes -= old[2] if old is not None else 0
            self._items[response_id] = (owner, conversation, weight)
            self._bytes += weight
            while len(self._items) > 1 and (len(self._items) > self._keep or self._bytes > self._keep_bytes):
                _, (_, _, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def get(self, response_id: str, owner: str) -> tuple[Message, ...] | None:
        with self._lock:
            found = self._items.get(response_id)
        return found[1] if found is not None and found[0] == owner else None

    def __len__(self) -> int:
        return len(self._items)


def _weight(conversation: tuple[Message, ...]) -> int:
    """About the bytes ``conversation`` holds: its text (reasoning and calls'
    arguments included) and its images' URLs. Messages a chain of responses
    shares count in each: an overestimate, which drops old links sooner."""
    images = sum(len(p.url or "") for m in conversation for p in m.parts() if isinstance(p, ImagePart))
    return Conversation(conversation).text_length() + images
