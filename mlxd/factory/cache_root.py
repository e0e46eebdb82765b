"""Where the factory keeps what it builds: models, and the tokenizers they share."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def default_cache_dir() -> Path:
    """``$MLXD_FACTORY_CACHE``, else ``~/.cache/mlxd/factory`` (``$XDG_CACHE_HOME`` honoured)."""
    base = os.environ.get("MLXD_FACTORY_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mlxd" / "factory"


def payload_key(payload: dict[str, Any], length: int = 12) -> str:
    """The short content key a built folder is named by: what built it
    (recipe, corpus digest, versions), hashed."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:length]
