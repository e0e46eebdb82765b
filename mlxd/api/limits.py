"""Per-app limits (an app's ``max_concurrency``, ``rpm``, ``tpm`` and
``tokens_per_day``) as a pure core: each call takes ``now`` (epoch
seconds), nothing reads a clock or does I/O, so every reset is replayed in
tests to the second. The gatekeeper is its shell: it admits a request or
refuses it with a 429, and gives the slot back when the answer has gone out;
accounting spends the tokens a finished request used.

Requests and tokens per minute are counted over the last 60 s (a sliding
window: a refusal's Retry-After is when enough of the window has slid out);
tokens per day over the UTC day (reset at midnight UTC)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

MINUTE = 60.0
DAY = 86400.0


@dataclass(frozen=True)
class Limits:
    max_concurrency: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    tokens_per_day: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.max_concurrency, self.rpm, self.tpm, self.tokens_per_day))


@dataclass(frozen=True)
class Headroom:
    """One limit as the ``x-ratelimit-*`` headers give it."""

    name: str  # requests, tokens, tokens-day, concurrency
    limit: int
    remaining: int
    reset_seconds: float


@dataclass(frozen=True)
class Admission:
    admitted: bool
    headroom: tuple[Headroom, ...] = ()
    # When refused: which limit (its registry key), and when to retry.
    refused_by: str | None = None
    retry_after: float = 0.0

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for h in self.headroom:
            out[f"x-ratelimit-limit-{h.name}"] = str(h.limit)
            out[f"x-ratelimit-remaining-{h.name}"] = str(max(0, h.remaining))
            out[f"x-ratelimit-reset-{h.name}"] = f"{max(0, math.ceil(h.reset_seconds))}s"
        return out


@dataclass
class _AppWindow:
    active: int = 0
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    day: int = -1
    day_tokens: int = 0

    def slide(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - MINUTE:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - MINUTE:
            self.tokens.popleft()
        today = int(now // DAY)
        if today != self.day:
            self.day, self.day_tokens = today, 0

    def minute_tokens(self) -> int:
        return sum(n for _, n in self.tokens)


@dataclass
class LimitBook:
    """Every app's windows, by app name."""

    _apps: dict[str, _AppWindow] = field(default_factory=dict)

    def admit(self, app: str, limits: Limits, now: float) -> Admission:
        """Take a slot (and count a request) if every limit has room."""
        w = self._apps.setdefault(app, _AppWindow())
        w.slide(now)
        room = self._headroom(w, limits, now)
        full = [h for h in room if h.remaining <= 0]
        if full:
            worst = max(full, key=lambda h: h.reset_seconds)
            return Admission(False, room, refused_by=KEYS[worst.name], retry_after=max(1.0, worst.reset_seconds))
        w.active += 1
        w.requests.append(now)
        return Admission(True, self._headroom(w, limits, now))

    def release(self, app: str) -> None:
        """The answer has gone out: its concurrency slot is free."""
        w = self._apps.get(app)
        if w is not None and w.active > 0:
            w.active -= 1

    def spend(self, app: str, tokens: int, now: float) -> None:
        """A finished request's tokens (in and out), toward tpm and the day."""
        if tokens <= 0:
            return
        w = self._apps.setdefault(app, _AppWindow())
        w.slide(now)
        w.tokens.append((now, tokens))
        w.day_tokens += tokens

    def restore_day(self, app: str, tokens: int, now: float) -> None:
        """Tokens this UTC day already used before a restart (from the activity log)."""
        w = self._apps.setdefault(app, _AppWindow())
        w.slide(now)
        w.day_tokens += max(0, tokens)

    def headroom(self, app: str, limits: Limits, now: float) -> tuple[Headroom, ...]:
        """Each limit's room now, as the next admission would see it (nothing taken)."""
        w = self._apps.get(app) or _AppWindow()
        w.slide(now)
        return self._headroom(w, limits, now)

    def active(self, app: str) -> int:
        w = self._apps.get(app)
        return w.active if w is not None else 0

    def _headroom(self, w: _AppWindow, limits: Limits, now: float) -> tuple[Headroom, ...]:
        out = []
        if limits.rpm is not None:
            # When the oldest request counted leaves the window.
            reset = (w.requests[0] + MINUTE - now) if len(w.requests) >= limits.rpm else 0.0
            out.append(Headroom("requests", limits.rpm, limits.rpm - len(w.requests), reset))
        if limits.tpm is not None:
            used = w.minute_tokens()
            out.append(Headroom("tokens", limits.tpm, limits.tpm - used, _tokens_reset(w, limits.tpm, used, now)))
        if limits.tokens_per_day is not None:
            midnight = (w.day + 1) * DAY
            out.append(Headroom("tokens-day", limits.tokens_per_day, limits.tokens_per_day - w.day_tokens,
                                midnight - now if w.day_tokens >= limits.tokens_per_day else 0.0))
        if limits.max_concurrency is not None:
            out.append(Headroom("concurrency", limits.max_concurrency, limits.max_concurrency - w.active,
                                1.0 if w.active >= limits.max_concurrency else 0.0))
        return tuple(out)


def _tokens_reset(w: _AppWindow, tpm: int, used: int, now: float) -> float:
    """How long until the window's tokens fall below ``tpm``."""
    if used < tpm:
        return 0.0
    for at, n in w.tokens:
        used -= n
        if used < tpm:
            return at + MINUTE - now
    return MINUTE


# A header's name for each limit -> the limit's registry key.
KEYS = {"requests": "rpm", "tokens": "tpm", "tokens-day": "tokens_per_day", "concurrency": "max_concurrency"}
