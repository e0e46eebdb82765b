"""Where the factory keeps what it builds: models, and the tokenizers they share."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$MLXD_FACTORY_CACHE``, else ``~/.cache/mlxd/factory`` (``$XDG_CACHE_HOME`` honoured)."""
    base = os.environ.get("MLXD_FACTORY_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mlxd" / "factory"
