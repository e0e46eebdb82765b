"""Files on disk, the two things several layers do with them alike.

``build_once``: a folder written whole or not at all, once, even with several
processes asking for it at the same moment (the GGUF import in production,
the test-model factory, the demo). ``file_sha256``: a file's content digest,
read in blocks so a many-gigabyte file never sits in memory.
``read_json_object``: a model folder's optional JSON file, or {}.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_BLOCK = 1 << 20


def file_sha256(path: Path, *, prefix: bytes = b"") -> Any:
    """The sha256 object over ``prefix`` then the bytes of ``path`` (call
    ``.hexdigest()`` or ``.digest()`` on it). Raises ``OSError`` as ``open`` does."""
    digest = hashlib.sha256(prefix)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest


def build_once(target: Path, write: Callable[[Path], None]) -> Path:
    """Return the model folder ``target``, running ``write(folder)`` first if it is missing.

    ``write`` fills a temporary sibling folder that is renamed into place, and
    builders of the same target wait on a lock file, so every builder (GGUF
    import, text or vision factory) gets the same crash and concurrency safety.
    """
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / "config.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            write(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, unreadable or not an
    object (a model folder's optional files: tokenizer_config.json, ...)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
