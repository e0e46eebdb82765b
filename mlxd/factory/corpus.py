"""Training text that exists on every machine: the standard library's sources."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path


def stdlib_files(max_bytes: int) -> list[Path]:
    """Standard-library ``*.py`` files in a fixed order, up to ``max_bytes``.

    Sorting by name keeps the selection (and so the trained vocabulary) stable
    for a given Python version.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen: list[Path] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        size = path.stat().st_size
        if total + size > max_bytes and chosen:
            break
        chosen.append(path)
        total += size
    return chosen


def corpus_digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
