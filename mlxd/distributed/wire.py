"""The control channel between the daemon and its ranks: one JSON object per
line, both ways. Pure: no pipes here, only the framing."""

from __future__ import annotations

import json
from typing import Any


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":")) + "\n"


def decode(line: str | bytes) -> dict[str, Any] | None:
    """A line -> its message; None for a blank or garbled line (a rank's
    channel carries nothing else, so garbage is ignored, never fatal)."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) else None
