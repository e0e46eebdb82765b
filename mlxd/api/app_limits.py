"""The shell around the limits core (``api/limits.py``): the app's limits
read from the registry in use (so a reload's new limits apply to the next
request), the clock, and the 429 a refusal becomes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxd.api.limits import KEYS, Admission, LimitBook, Limits
from mlxd.errors import RateLimited
from mlxd.registry.model import AppSpec

_SAID = {
    "rpm": "requests per minute", "tpm": "tokens per minute", "tokens_per_day": "tokens per day",
    "max_concurrency": "requests at once",
}


def limits_of(app: AppSpec) -> Limits:
    return Limits(app.max_concurrency, app.rpm, app.tpm, app.tokens_per_day)


@dataclass
class AppLimits:
    clock: Callable[[], float] = time.time
    book: LimitBook = field(default_factory=LimitBook)

    def admit(self, app: AppSpec | None) -> Admission | None:
        """None: nothing to limit. Raises RateLimited when a limit is full."""
        if app is None or not limits_of(app).any():
            return None
        limits = limits_of(app)
        admission = self.book.admit(app.name, limits, self.clock())
        if not admission.admitted:
            key = admission.refused_by or "rpm"
            limit = getattr(limits, key)
            raise RateLimited(
                f"App `{app.name}` is over its limit of {limit} {_SAID[key]} (`{key}`); "
                f"retry in {admission.retry_after:.0f} s",
                retry_after=admission.retry_after, limit_headers=admission.headers(),
            )
        return admission

    def room(self, app: AppSpec) -> list[dict[str, Any]]:
        """Each of the app's limits (``name``: its registry key), what is
        left of it now and when it resets (s), for status and metrics."""
        return [{"name": KEYS[h.name], "limit": h.limit, "remaining": max(0, h.remaining),
                 "reset_seconds": round(max(0.0, h.reset_seconds), 1)}
                for h in self.book.headroom(app.name, limits_of(app), self.clock())]

    def release(self, app: str) -> None:
        self.book.release(app)

    def spend(self, app: str | None, tokens: int) -> None:
        if app is not None:
            self.book.spend(app, tokens, self.clock())
