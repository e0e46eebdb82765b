"""Usage per app and model: requests, errors, and tokens in, cached and out,
since the state directory began (the activity log's sqlite keeps the
totals, so they outlive a restart; ``ActivityLog.usage_totals``). Counted
where a request's accounts are made; read by /v1/status, /metrics and
``mlxd status``. The app is the caller's name: an app's, or a flat key's
short hash, or ``local``."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from typing import Any


@dataclass
class Usage:
    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_cached: int = 0
    tokens_out: int = 0

    def add(self, other: Usage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


USAGE_FIELDS = tuple(f.name for f in fields(Usage))


def one_request(status: int, tokens_in: int = 0, tokens_cached: int = 0, tokens_out: int = 0) -> Usage:
    return Usage(1, int(status >= 400), tokens_in, tokens_cached, tokens_out)


class UsageBook:
    """The totals by (app, model). Only the event loop writes it."""

    def __init__(self) -> None:
        self._totals: dict[tuple[str, str], Usage] = {}

    def add(self, app: str, model: str, usage: Usage) -> None:
        self._totals.setdefault((app, model), Usage()).add(usage)

    def restore(self, rows: list[tuple[Any, ...]]) -> None:
        """Totals an earlier run left: ``(app, model, *USAGE_FIELDS)`` rows."""
        for app, model, *values in rows:
            self.add(app, model, Usage(*(int(v or 0) for v in values)))

    def rows(self) -> list[dict[str, Any]]:
        return [{"app": app, "model": model, **dict(zip(USAGE_FIELDS, astuple(u)))}
                for (app, model), u in sorted(self._totals.items())]
