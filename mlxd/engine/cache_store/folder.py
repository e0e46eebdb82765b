"""One fingerprint's folder of saved prefix-cache entries (``CacheStore``).

Entries are written first, the manifest last; an entry only counts once the
manifest names it, and the manifest records its size, token count and
SHA-256. So a daemon killed in the middle of a save leaves either the old
manifest (the new files are orphans, removed later) or the new one, never a
manifest naming a half-written file. An entry whose size or checksum does not
match is dropped with a warning and deleted.

A fingerprint folder that is a symlink is never used: mlxd would write into,
and clean up, whatever it points at.

Plain file I/O: run it with ``asyncio.to_thread``, never on the event loop.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxd.engine.cache_store.files import (
    ENTRY_SUFFIX,
    LOCKS,
    MANIFEST,
    atomic_write,
    clear_folder,
    remove_file,
    written_by_mlxd,
)
from mlxd.engine.fingerprint import CACHE_FORMAT_VERSION
from mlxd.errors import describe_exception

log = logging.getLogger(__name__)

# Unreferenced files younger than this may be another saver's entries that
# its manifest does not name yet; older ones are leftovers of a killed save.
ORPHAN_GRACE_SECONDS = 300.0


class UnsafeCacheFolder(OSError):
    """The fingerprint folder is a symlink or not a folder: mlxd leaves it alone."""


def entry_name(tokens: Sequence[int]) -> str:
    """An entry's file name: the same tokens always give the same KV (same
    fingerprint), so a name already on disk need not be written again."""
    packed = struct.pack(f"<{len(tokens)}i", *tokens)
    return hashlib.sha256(packed).hexdigest()[:32] + ENTRY_SUFFIX


@dataclass(frozen=True)
class StoredEntry:
    file: str
    tokens: int
    sha256: str
    bytes: int

    @classmethod
    def parse(cls, raw: Any) -> StoredEntry:
        if not isinstance(raw, dict):
            raise ValueError("an entry is not an object")
        entry = cls(file=raw.get("file"), tokens=raw.get("tokens"), sha256=raw.get("sha256"), bytes=raw.get("bytes"))
        if not (
            isinstance(entry.file, str)
            and entry.file.endswith(ENTRY_SUFFIX)
            and written_by_mlxd(entry.file)
            and isinstance(entry.tokens, int)
            and entry.tokens > 0
            and isinstance(entry.sha256, str)
            and len(entry.sha256) == 64
            and isinstance(entry.bytes, int)
            and entry.bytes > 0
        ):
            raise ValueError(f"malformed entry {raw!r:.200}")
        return entry


@dataclass
class Manifest:
    entries: list[StoredEntry] = field(default_factory=list)
    saved_at: float | None = None
    save_seconds: float | None = None

    @property
    def nbytes(self) -> int:
        return sum(e.bytes for e in self.entries)


class CacheStore:
    """One fingerprint's folder. Plain file I/O: never call it on the event loop."""

    def __init__(self, root: Path, fingerprint: str, max_bytes: int) -> None:
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.folder = self.root / fingerprint
        self.max_bytes = max(0, int(max_bytes))
        self._use: contextlib.ExitStack | None = None

    # ----------------------------------------------------------------- use
    def hold(self) -> None:
        """Mark the folder in use (a shared flock on its use lock) from the
        start of a model's load, restore included, until ``release``: the
        cache-dir bound of any daemon sharing the dir never removes it
        meanwhile. Blocks while a bound is removing it; call it in a thread."""
        if self._use is not None:
            return
        use = contextlib.ExitStack()
        try:
            use.enter_context(folder_lock(self.root, self.fingerprint, kind=USE, shared=True))
        except OSError as exc:  # the dir cannot be used: saving will say so too, and fail nothing
            log.warning("prefix cache %s: cannot mark the folder in use (%s)", self.fingerprint,
                        describe_exception(exc))
            return
        self._use = use

    def release(self) -> None:
        use, self._use = self._use, None
        if use is not None:
            use.close()

    # ------------------------------------------------------------- reading
    def read_manifest(self) -> Manifest:
        """The manifest (empty if none); a corrupt one or one written for
        another fingerprint is removed with a warning. Also clears out
        leftovers of interrupted saves. A symlinked folder reads as empty."""
        try:
            self._check_folder()
        except UnsafeCacheFolder as exc:
            log.warning("prefix cache %s: %s", self.fingerprint, exc)
            return Manifest()
        with self._locked():
            manifest = self._load_manifest()
            self._remove_orphans(manifest)
            return manifest

    def read_entry(self, entry: StoredEntry) -> bytes | None:
        """An entry's bytes if its size and checksum match the manifest;
        otherwise the file is deleted, a warning logged, and None returned."""
        path = self.folder / entry.file
        try:
            self._check_folder()
            payload = path.read_bytes()
        except FileNotFoundError:
            log.warning("prefix cache %s: entry %s is missing; dropping it", self.fingerprint, entry.file)
            return None
        except OSError as exc:
            log.warning("prefix cache %s: cannot read %s (%s); dropping it", self.fingerprint, entry.file,
                        describe_exception(exc))
            self._remove(entry.file)
            return None
        if len(payload) != entry.bytes or hashlib.sha256(payload).hexdigest() != entry.sha256:
            log.warning("prefix cache %s: entry %s is damaged (size or checksum); deleting it",
                        self.fingerprint, entry.file)
            self._remove(entry.file)
            return None
        return payload

    # ------------------------------------------------------------- writing
    def write_entry(self, name: str, payload: bytes, tokens: int) -> StoredEntry:
        """Write one entry atomically; it counts once ``commit`` names it."""
        self._check_folder()
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(self.folder / name, payload)
        return StoredEntry(file=name, tokens=tokens, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload))

    def commit(self, saved: Sequence[StoredEntry], drop: set[str], save_seconds: float) -> Manifest:
        """Make ``saved`` (most recent first) the newest entries, keep older
        ones on disk after them unless in ``drop``, evict the least recently
        used beyond ``max_bytes`` and write the manifest atomically."""
        self._check_folder()
        with self._locked():
            current = self._load_manifest()
            merged: list[StoredEntry] = []
            seen: set[str] = set()
            for entry in [*saved, *(e for e in current.entries if e.file not in drop)]:
                if entry.file in seen or not (self.folder / entry.file).is_file():
                    continue
                seen.add(entry.file)
                merged.append(entry)
            kept: list[StoredEntry] = []
            total = 0
            for entry in merged:
                if total + entry.bytes > self.max_bytes:
                    break
                kept.append(entry)
                total += entry.bytes
            manifest = Manifest(kept, saved_at=time.time(), save_seconds=round(save_seconds, 4))
            self._write_manifest(manifest)
            names = {e.file for e in kept}
            for entry in [*current.entries, *saved]:
                if entry.file not in names:
                    self._remove(entry.file)
            return manifest

    def forget(self, files: set[str]) -> Manifest:
        """Remove entries from the manifest (and disk), e.g. ones that failed
        to load."""
        self._check_folder()
        with self._locked():
            current = self._load_manifest()
            manifest = Manifest(
                [e for e in current.entries if e.file not in files], current.saved_at, current.save_seconds
            )
            if len(manifest.entries) != len(current.entries):
                self._write_manifest(manifest)
            for name in files:
                self._remove(name)
            return manifest

    def discard(self, files: set[str]) -> None:
        """Remove files a failed save wrote, unless a manifest (another
        daemon's save of the same entries) names them by now."""
        with contextlib.suppress(OSError), self._locked():
            self._check_folder()
            named = {e.file for e in self._load_manifest().entries}
            for name in files - named:
                self._remove(name)

    # ------------------------------------------------------------ internal
    def _check_folder(self) -> None:
        try:
            st = os.lstat(self.folder)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeCacheFolder(f"{self.folder} is a symlink; mlxd neither reads, writes nor deletes through it")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeCacheFolder(f"{self.folder} is not a folder")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise manifest updates of one folder across tasks and processes."""
        with folder_lock(self.root, self.fingerprint):
            yield

    def _load_manifest(self) -> Manifest:
        path = self.folder / MANIFEST
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return Manifest()
        except (OSError, ValueError) as exc:
            log.warning("prefix cache %s: unreadable manifest (%s); starting empty",
                        self.fingerprint, describe_exception(exc))
            self._remove(MANIFEST)
            return Manifest()
        if not isinstance(raw, dict) or raw.get("format") != CACHE_FORMAT_VERSION:
            log.warning("prefix cache %s: manifest of another format; starting empty", self.fingerprint)
            self._remove(MANIFEST)
            return Manifest()
        if raw.get("fingerprint") != self.fingerprint:
            # A folder copied or renamed from another model: none of it is ours
            # to read, and only what mlxd wrote is ours to delete.
            log.warning("prefix cache %s: the folder holds another model's cache (%s); deleting its entries",
                        self.fingerprint, str(raw.get("fingerprint"))[:40])
            clear_folder(self.folder)
            return Manifest()
        entries = []
        for item in raw.get("entries") or []:
            try:
                entries.append(StoredEntry.parse(item))
            except ValueError as exc:
                log.warning("prefix cache %s: %s; dropping it", self.fingerprint, exc)
        saved_at = raw.get("saved_at")
        seconds = raw.get("save_seconds")
        return Manifest(
            entries,
            saved_at=float(saved_at) if isinstance(saved_at, (int, float)) else None,
            save_seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
        )

    def _write_manifest(self, manifest: Manifest) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": CACHE_FORMAT_VERSION,
            "fingerprint": self.fingerprint,
            "saved_at": manifest.saved_at,
            "save_seconds": manifest.save_seconds,
            "entries": [asdict(e) for e in manifest.entries],
        }
        atomic_write(self.folder / MANIFEST, json.dumps(doc, indent=1).encode())

    def _remove_orphans(self, manifest: Manifest) -> None:
        if not self.folder.is_dir():
            return
        named = {e.file for e in manifest.entries} | {MANIFEST}
        cutoff = time.time() - ORPHAN_GRACE_SECONDS
        for path in self.folder.iterdir():
            if path.name in named or not written_by_mlxd(path.name):
                continue
            with contextlib.suppress(OSError):
                if os.lstat(path).st_mtime < cutoff and remove_file(path):
                    log.info("prefix cache %s: removed leftover %s", self.fingerprint, path.name)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            remove_file(self.folder / name)


# A folder's two locks: ``lock`` serialises manifest updates (held briefly,
# exclusively); ``use`` is held shared by every daemon that has the model
# loaded or loading, and exclusively by a bound while it removes the folder.
LOCK, USE = "lock", "use"


def named_size(folder: Path) -> tuple[int, float]:
    """The bytes of the entries the folder's manifest names, and when it was
    last saved (the manifest's time; without one, its newest file's). Torn
    temporary files and orphans are not the cache: the bound counts what a
    restore would read. Reads without the lock: manifests are replaced whole."""
    try:
        st = os.lstat(folder / MANIFEST)
        raw = json.loads((folder / MANIFEST).read_bytes()) if stat.S_ISREG(st.st_mode) else None
    except (OSError, ValueError):
        raw, st = None, None
    if not isinstance(raw, dict) or st is None:
        newest = 0.0
        with contextlib.suppress(OSError):
            for item in folder.iterdir():
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(item).st_mtime)
        return 0, newest
    size = 0
    for item in raw.get("entries") or []:
        with contextlib.suppress(ValueError):
            size += StoredEntry.parse(item).bytes
    return size, st.st_mtime


@contextlib.contextmanager
def folder_lock(
    root: Path, fingerprint: str, *, blocking: bool = True, kind: str = LOCK, shared: bool = False
) -> Iterator[bool]:
    """A flock on one of a folder's lock files (exclusive unless ``shared``);
    yields whether it was taken (always, when blocking)."""
    locks = Path(root) / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{fingerprint}.{kind}", "a+") as handle:
        try:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            fcntl.flock(handle, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
