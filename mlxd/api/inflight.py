"""The requests under way now, findable by their ``X-Request-Id`` or by
the response object's own id, so that one can be cancelled
(``POST /v1/requests/{id}/cancel``) and the dashboard can list them. Event
loop only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class InFlightRequest:
    request_id: str
    response_id: str
    model: str
    surface: str
    caller: str
    stream: bool
    started_at: float = field(default_factory=time.time)
    # Set by cancel(): the request path races its work against it.
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    _on_cancel: list[Callable[[], None]] = field(default_factory=list)
    # Its capture (``mlxd.api.capture.Captured``), when it is captured.
    capture: Any = None
    # A request that generates tokens (chat, completion, messages,
    # responses) says where it is; its output meter
    # (``monitoring.metrics.OutputMeter``) is set once its path makes one.
    generates: bool = False
    meter: Any = None

    def phase(self) -> str | None:
        """``queued`` (for a lease: a load, a free slot, the budget),
        ``prefill`` (its engine took it, no token yet) or ``decode``; None
        for a request that generates no tokens."""
        if not self.generates:
            return None
        if self.meter is None or self.meter.accepted_at is None:
            return "queued"
        return "prefill" if self.meter.first_token_at is None else "decode"

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """``callback()`` once, when (or if already) cancelled."""
        if self.cancelled.is_set():
            callback()
        else:
            self._on_cancel.append(callback)

    def cancel(self) -> None:
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.request_id, "response_id": self.response_id, "model": self.model,
            "surface": self.surface, "key": self.caller, "stream": self.stream,
            "started_at": round(self.started_at, 3), "cancelled": self.cancelled.is_set(),
            "phase": self.phase(), "tokens_out": self.meter.tokens_out if self.meter is not None else None,
        }


class InFlight:
    def __init__(self) -> None:
        self._all: dict[int, InFlightRequest] = {}

    def add(self, entry: InFlightRequest) -> InFlightRequest:
        self._all[id(entry)] = entry
        return entry

    def remove(self, entry: InFlightRequest) -> None:
        """Safe to call more than once."""
        self._all.pop(id(entry), None)

    def find(self, request_id: str, mine: Callable[[InFlightRequest], bool] = lambda _: True) -> InFlightRequest | None:
        """The newest request under way with that X-Request-Id or response
        id among those ``mine`` accepts. Ids are the clients' own, so two
        may share one: an app reusing another's id must not hide that
        request from its owner (a scan: only the requests under way)."""
        found = [e for e in self._all.values() if request_id in (e.request_id, e.response_id) and mine(e)]
        return max(reversed(found), key=lambda e: e.started_at, default=None)

    def entries(self) -> list[InFlightRequest]:
        return sorted(self._all.values(), key=lambda e: e.started_at)

    def __len__(self) -> int:
        return len(self._all)
