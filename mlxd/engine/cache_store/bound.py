"""The cache dir's total bound, safe for several daemons sharing one dir.

After each save, a daemon keeps the folders under ``<cache_dir>/prefix`` that
are *its own* within the sum of its models' ``disk_max_bytes``, deleting
whole folders, least recently saved first. Its own are the fingerprints it
has loaded or saved in this run (``CacheDirBound.adopt``); another daemon's
folders are neither counted nor deleted, unless nothing has saved to them for
``STALE_SECONDS`` (the leftovers of a replaced model, or of a daemon long
gone), which then go first. A lock file (``.locks/bound.lock``) keeps two
daemons from bounding at the same time, and a folder whose manifest is being
updated (its flock is held) is never removed, nor one whose model any daemon
has loaded or is loading (its use lock is held shared, restore included).
Folders are sized by the bytes their manifests name: torn temporary files of
a killed save are not the cache and do not push live folders out. Removal
deletes only the files mlxd wrote (``files.clear_folder``) and never follows
a symlink.

Plain file I/O: run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from mlxd.engine.cache_store.files import LOCKS, clear_folder, is_real_folder
from mlxd.engine.cache_store.folder import USE, folder_lock, named_size

log = logging.getLogger(__name__)

# A folder nothing has saved to for this long is fair game for any daemon.
STALE_SECONDS = 30 * 24 * 3600.0
BOUND_LOCK = "bound.lock"


@dataclass(frozen=True)
class _Folder:
    path: Path
    newest: float
    size: int


def enforce_total_bound(
    root: Path,
    max_bytes: int,
    *,
    ours: Collection[str],
    keep: Collection[str] = (),
    stale_seconds: float = STALE_SECONDS,
    now: float | None = None,
) -> list[str]:
    """Keep the folders in ``ours`` (plus stale ones) within ``max_bytes``
    together by deleting whole folders, least recently saved first, never one
    named in ``keep`` nor one being updated. Returns the folders removed."""
    root = Path(root)
    if not is_real_folder(root):
        return []
    now = time.time() if now is None else now
    locks = root / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / BOUND_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            candidates = [
                f for f in _folders(root)
                if f.path.name in ours or now - f.newest > stale_seconds
            ]
            return _evict(root, candidates, max_bytes, set(keep))
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _folders(root: Path) -> list[_Folder]:
    """The fingerprint folders under ``root``, sized by what their manifests
    name; symlinks are not followed (nor listed)."""
    found = []
    for path in root.iterdir():
        if path.name.startswith(".") or not is_real_folder(path):
            continue
        size, newest = named_size(path)
        found.append(_Folder(path, newest, size))
    return found


def _evict(root: Path, folders: list[_Folder], max_bytes: int, keep: set[str]) -> list[str]:
    total = sum(f.size for f in folders)
    removed = []
    for folder in sorted(folders, key=lambda f: f.newest):
        if total <= max_bytes:
            break
        if folder.path.name in keep or folder.size == 0:
            continue  # a folder of no named bytes frees nothing (it may be a first save under way)
        name = folder.path.name
        # Not while any daemon has the model loaded or loading (its use lock
        # is held shared), nor while its manifest is being updated.
        with folder_lock(root, name, blocking=False, kind=USE) as unused, \
                folder_lock(root, name, blocking=False) as taken:
            if not (unused and taken):
                continue
            clear_folder(folder.path)
        total -= folder.size
        removed.append(folder.path.name)
        log.info("prefix cache: removed %s to keep the cache dir under %d MB", folder.path.name, max_bytes >> 20)
    return removed


class CacheDirBound:
    """One daemon's side of the shared bound: which folders it owns."""

    def __init__(self) -> None:
        self._ours: set[str] = set()

    def adopt(self, fingerprint: str) -> None:
        self._ours.add(fingerprint)

    def enforce(self, root: Path, max_bytes: int, keep: str) -> list[str]:
        """After ``keep`` was saved: bound this daemon's folders (file I/O)."""
        self.adopt(keep)
        return enforce_total_bound(root, max_bytes, ours=set(self._ours), keep={keep})
