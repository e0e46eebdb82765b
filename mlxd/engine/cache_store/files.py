"""The files mlxd writes in the cache dir, and the only ones it deletes.

Crash safety: every file is written to a temporary name, fsynced, renamed and
the folder fsynced, so a crash leaves the old file or the new one.

Deletion is by name and by kind: only a regular file whose name is one mlxd
gives (a manifest, an entry, a temporary file of either) is removed, never a
directory, never through a symlink. A cache dir is a place users point at
their own folders (or link them in by mistake); whatever else is found there
is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from pathlib import Path

MANIFEST = "manifest.json"
ENTRY_SUFFIX = ".safetensors"
LOCKS = ".locks"

_ENTRY = re.compile(r"[0-9a-f]{32}\.safetensors")
_TEMPORARY = re.compile(r"\.(manifest\.json|[^/]+\.safetensors)\.\d+\.\d+\.tmp")


def written_by_mlxd(name: str) -> bool:
    """Whether ``name`` is a file name mlxd gives inside a fingerprint folder."""
    return name == MANIFEST or bool(_ENTRY.fullmatch(name) or _TEMPORARY.fullmatch(name))


def is_real_folder(path: Path) -> bool:
    """A directory that is not a symlink (``Path.is_dir`` follows links)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_file(path: Path) -> bool:
    """Remove ``path`` if it is a regular file with a name mlxd gives; a
    symlink, a directory or a foreign name is left alone. Returns whether it went."""
    if not written_by_mlxd(path.name):
        return False
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def clear_folder(folder: Path) -> list[str]:
    """Remove what mlxd wrote in ``folder`` (not through a symlinked folder);
    the folder itself goes too once nothing else is in it. Returns the names removed."""
    if not is_real_folder(folder):
        return []
    removed = []
    for path in list(folder.iterdir()):
        with contextlib.suppress(OSError):
            if remove_file(path):
                removed.append(path.name)
    with contextlib.suppress(OSError):
        folder.rmdir()  # fails, as it should, while anything foreign is left
    return removed


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the
    new one: a temporary name, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
