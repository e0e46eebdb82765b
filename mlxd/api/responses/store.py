"""Recent responses, so a request can continue one by ``previous_response_id``.

Also what GET and DELETE /v1/responses/{id} read and forget.

Bounded and in memory only: the oldest response goes when the store is
full, by count or by bytes, and none survives a restart. A client that
needs more keeps its own history and sends it (``store: false`` is the
stateless way, what Codex does).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

from mlxd.api.conversation import Conversation, ImagePart, Message

# Responses kept. Each holds its whole conversation (text, and images as the
# URLs they came as, not read).
KEEP = 256
# And at most about this much of them: a data: URL image is megabytes, and
# 256 such conversations would hold gigabytes a client made the daemon keep.
KEEP_BYTES = 256 << 20


class Stored(NamedTuple):
    owner: str
    conversation: tuple[Message, ...]
    # The response object as it was answered, for GET /v1/responses/{id}.
    response: dict[str, Any]
    weight: int


class ResponseStore:
    """Each response is kept with its owner (the caller's name: its app, or
    its key's name), and only its owner continues it: another app's
    ``previous_response_id`` is not found, as an unknown one is."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._bytes = 0

    def put(
        self, response_id: str, owner: str, conversation: tuple[Message, ...], response: dict[str, Any] | None = None
    ) -> None:
        """``conversation``: every message up to and including the response's
        own output, without the request's instructions (they do not carry over);
        ``response``: the response object answered.
        The newest is kept even alone past the byte bound: it is the one a
        client continues next."""
        response = response or {}
        # The response object holds what the conversation does not: the
        # request's instructions and tools, which a client makes any size.
        weight = _weight(conversation) + len(json.dumps(response))
        with self._lock:
            old = self._items.pop(response_id, None)
            self._bytes -= old.weight if old is not None else 0
            self._items[response_id] = Stored(owner, conversation, response, weight)
            self._bytes += weight
            while len(self._items) > 1 and (len(self._items) > self._keep or self._bytes > self._keep_bytes):
                _, dropped = self._items.popitem(last=False)
                self._bytes -= dropped.weight

    def stored(self, response_id: str, owner: str) -> Stored | None:
        with self._lock:
            found = self._items.get(response_id)
        return found if found is not None and found.owner == owner else None

    def get(self, response_id: str, owner: str) -> tuple[Message, ...] | None:
        found = self.stored(response_id, owner)
        return found.conversation if found is not None else None

    def delete(self, response_id: str, owner: str) -> bool:
        """Whether ``owner``'s response was there to delete."""
        with self._lock:
            found = self._items.get(response_id)
            if found is None or found.owner != owner:
                return False
            del self._items[response_id]
            self._bytes -= found.weight
        return True

    def __len__(self) -> int:
        return len(self._items)


def _weight(conversation: tuple[Message, ...]) -> int:
    """About the bytes ``conversation`` holds: its text (reasoning and calls'
    arguments included) and its images' URLs. Messages a chain of responses
    shares count in each: an overestimate, which drops old links sooner."""
    images = sum(len(p.url or "") for m in conversation for p in m.parts() if isinstance(p, ImagePart))
    return Conversation(conversation).text_length() + images
