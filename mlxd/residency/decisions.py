"""A bounded ring of residency decisions, each with its reason, for operators."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    at: float  # wall-clock seconds since the epoch
    kind: str  # load | unload | evict | preempt | drain | failure | reload | ...
    model: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventLog:
    def __init__(self, maxlen: int = 200) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)

    def add(self, kind: str, model: str, message: str, at: float | None = None) -> Event:
        event = Event(at if at is not None else time.time(), kind, model, message)
        self._events.append(event)
        return event

    def recent(self, limit: int | None = None) -> list[Event]:
        events = list(self._events)
        return events[-limit:] if limit else events
