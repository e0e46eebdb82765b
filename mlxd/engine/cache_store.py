"""Prefix caches on disk: saved when a model unloads, restored when it loads.

Layout, under the manager's cache dir::

    prefix/
      .locks/<fingerprint>.lock        one flock per folder (never deleted)
      <fingerprint>/
        manifest.json                  the entries, most recently used first
        <sha256 of the tokens>.safetensors   one entry: KV arrays + token ids

The fingerprint (``engine/fingerprint.py``) names everything that changes the
KV values, so a folder is only ever read by the model that wrote it.

Crash safety: every file is written to a temporary name, fsynced, renamed and
the folder fsynced. Entries are written first, the manifest last; an entry
only counts once the manifest names it, and the manifest records its size,
token count and SHA-256. So a daemon killed in the middle of a save leaves
either the old manifest (the new files are orphans, removed later) or the new
one, never a manifest naming a half-written file. On restore an entry whose
size, checksum, fingerprint, token count or KV length does not match is
dropped with a warning and deleted.

Threads: ``CacheStore`` is plain file I/O (run it with ``asyncio.to_thread``);
MLX work (bytes <-> arrays) runs on the worker. ``PrefixCachePersistence``
drives the two from the event loop, one entry at a time, so neither the loop
nor other models' decoding waits for the disk. Errors are logged and never
fail a load, an unload or a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxd.engine.fingerprint import CACHE_FORMAT_VERSION
from mlxd.engine.prefix_cache import EntryError, PrefixCache, Snapshot, decode_entry, encode_entry, persistable
from mlxd.engine.restore_policy import RateMeter, Rates, decide
from mlxd.engine.worker import MlxWorker
from mlxd.errors import describe_exception

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ENTRY_SUFFIX = ".safetensors"
LOCKS = ".locks"
# Unreferenced files younger than this may be another saver's entries that
# its manifest does not name yet; older ones are leftovers of a killed save.
ORPHAN_GRACE_SECONDS = 300.0


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
            and "/" not in entry.file
            and not entry.file.startswith(".")
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

    # ------------------------------------------------------------- reading
    def read_manifest(self) -> Manifest:
        """The manifest (empty if none); a corrupt one or one written for
        another fingerprint is removed with a warning. Also clears out
        leftovers of interrupted saves."""
        with self._locked():
            manifest = self._load_manifest()
            self._remove_orphans(manifest)
            return manifest

    def read_entry(self, entry: StoredEntry) -> bytes | None:
        """An entry's bytes if its size and checksum match the manifest;
        otherwise the file is deleted, a warning logged, and None returned."""
        path = self.folder / entry.file
        try:
            payload = path.read_bytes()
        except FileNotFoundError:
            log.warning("prefix cache %s: entry %s is missing; dropping it", self.fingerprint, entry.file)
            return None
        except OSError as exc:
            log.warning("prefix cache %s: cannot read %s (%s); dropping it", self.fingerprint, entry.file,
                        describe_exception(exc))
            self._unlink(path)
            return None
        if len(payload) != entry.bytes or hashlib.sha256(payload).hexdigest() != entry.sha256:
            log.warning("prefix cache %s: entry %s is damaged (size or checksum); deleting it",
                        self.fingerprint, entry.file)
            self._unlink(path)
            return None
        return payload

    # ------------------------------------------------------------- writing
    def write_entry(self, name: str, payload: bytes, tokens: int) -> StoredEntry:
        """Write one entry atomically; it counts once ``commit`` names it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(self.folder / name, payload)
        return StoredEntry(file=name, tokens=tokens, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload))

    def commit(self, saved: Sequence[StoredEntry], drop: set[str], save_seconds: float) -> Manifest:
        """Make ``saved`` (most recent first) the newest entries, keep older
        ones on disk after them unless in ``drop``, evict the least recently
        used beyond ``max_bytes`` and write the manifest atomically."""
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
                    self._unlink(self.folder / entry.file)
            return manifest

    def forget(self, files: set[str]) -> Manifest:
        """Remove entries from the manifest (and disk), e.g. ones that failed
        to load."""
        with self._locked():
            current = self._load_manifest()
            manifest = Manifest(
                [e for e in current.entries if e.file not in files], current.saved_at, current.save_seconds
            )
            if len(manifest.entries) != len(current.entries):
                self._write_manifest(manifest)
            for name in files:
                self._unlink(self.folder / name)
            return manifest

    # ------------------------------------------------------------ internal
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise manifest updates of one folder across tasks and processes."""
        locks = self.root / LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{self.fingerprint}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _load_manifest(self) -> Manifest:
        path = self.folder / MANIFEST
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return Manifest()
        except (OSError, ValueError) as exc:
            log.warning("prefix cache %s: unreadable manifest (%s); starting empty",
                        self.fingerprint, describe_exception(exc))
            self._unlink(path)
            return Manifest()
        if not isinstance(raw, dict) or raw.get("format") != CACHE_FORMAT_VERSION:
            log.warning("prefix cache %s: manifest of another format; starting empty", self.fingerprint)
            self._unlink(path)
            return Manifest()
        if raw.get("fingerprint") != self.fingerprint:
            # A folder copied or renamed from another model: none of it is ours.
            log.warning("prefix cache %s: the folder holds another model's cache (%s); deleting it",
                        self.fingerprint, str(raw.get("fingerprint"))[:40])
            self._clear_folder()
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
            if path.name in named:
                continue
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    log.info("prefix cache %s: removing leftover %s", self.fingerprint, path.name)
                    self._unlink(path)

    def _clear_folder(self) -> None:
        for path in list(self.folder.iterdir()) if self.folder.is_dir() else []:
            self._unlink(path)

    @staticmethod
    def _unlink(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            try:
                path.unlink()
            except IsADirectoryError:
                shutil.rmtree(path, ignore_errors=True)


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


def enforce_total_bound(root: Path, max_bytes: int, keep: Collection[str] = ()) -> list[str]:
    """Keep all of ``root``'s cache folders within ``max_bytes`` together by
    deleting whole folders, least recently saved first (stale fingerprints of
    replaced models go first), never one named in ``keep`` nor one whose
    manifest is being updated. Returns the folders removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = []
    for folder in root.iterdir():
        if not folder.is_dir() or folder.name == LOCKS:
            continue
        size, newest = 0, 0.0
        for path in folder.iterdir():
            with contextlib.suppress(OSError):
                st = path.stat()
                size += st.st_size
                newest = max(newest, st.st_mtime)
        folders.append((newest, size, folder))
    total = sum(size for _, size, _ in folders)
    removed = []
    for _, size, folder in sorted(folders, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        if folder.name in keep:
            continue
        if _remove_unless_busy(root, folder):
            total -= size
            removed.append(folder.name)
            log.info("prefix cache: removed %s to keep the cache dir under %d MB", folder.name, max_bytes >> 20)
    return removed


def _remove_unless_busy(root: Path, folder: Path) -> bool:
    locks = root / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{folder.name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    return True


# ---------------------------------------------------------------- driving
@dataclass
class PersistenceStats:
    disk_entries: int | None = None
    disk_bytes: int | None = None
    restored_entries: int = 0
    # Saved entries the restore left for requests to prefill (cheaper on this device).
    recompute_entries: int = 0
    last_save_seconds: float | None = None
    last_restore_seconds: float | None = None


class PrefixCachePersistence:
    """Saves and restores one engine's ``PrefixCache`` through a ``CacheStore``.

    Called from the event loop: MLX work goes to the worker, file I/O to a
    thread, one entry at a time (so memory holds one serialised entry at a
    time and other models decode in between).
    """

    def __init__(
        self,
        store: CacheStore,
        worker: MlxWorker,
        cache: PrefixCache,
        prefill_rate: Callable[[], float | None] | None = None,
    ) -> None:
        self.store = store
        self.worker = worker
        self.cache = cache
        # This device's prefill tokens/s (the warm-up measures it), for the
        # restore-or-recompute decision (mlxd.engine.restore_policy).
        self.prefill_rate = prefill_rate
        self.stats = PersistenceStats()

    @property
    def fingerprint(self) -> str:
        return self.store.fingerprint

    async def restore(self) -> int:
        """Load saved entries, most recently used first, until the in-memory
        budget is full. Returns how many the cache holds; never raises."""
        started = time.perf_counter()
        try:
            restored = await self._restore()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("prefix cache %s: restore failed: %s", self.fingerprint, describe_exception(exc))
            restored = 0
        self.stats.restored_entries = restored
        self.stats.last_restore_seconds = round(time.perf_counter() - started, 4)
        if restored:
            log.info("prefix cache %s: restored %d entries in %.2fs", self.fingerprint, restored,
                     self.stats.last_restore_seconds)
        return restored

    async def _restore(self) -> int:
        store = self.store
        manifest = await asyncio.to_thread(store.read_manifest)
        self._seen(manifest)
        self.stats.last_save_seconds = manifest.save_seconds
        loaded: list[tuple[list[int], list[Any]]] = []
        bad: set[str] = set()
        budget = self.cache.max_bytes
        meter, prefill, left = RateMeter(), self.prefill_rate() if self.prefill_rate else None, 0
        for entry in manifest.entries:
            if entry.bytes > budget:
                continue
            decision = decide(entry.tokens, entry.bytes, Rates(prefill, meter.rate))
            if not decision.restore:
                left += 1
                log.debug("prefix cache %s: entry %s left to recompute: %s", store.fingerprint, entry.file,
                          decision.reason)
                continue
            started = time.perf_counter()
            payload = await asyncio.to_thread(store.read_entry, entry)
            if payload is None:
                bad.add(entry.file)
                continue
            try:
                tokens, cache = await self.worker.call(decode_entry, payload, store.fingerprint, entry.tokens)
            except EntryError as exc:
                log.warning("prefix cache %s: entry %s: %s; deleting it", store.fingerprint, entry.file, exc)
                bad.add(entry.file)
                continue
            del payload
            meter.record(entry.bytes, time.perf_counter() - started)
            loaded.append((tokens, cache))
            budget -= entry.bytes
        self.stats.recompute_entries = left
        if left:
            log.info("prefix cache %s: %d saved entries are faster to recompute here than to restore "
                     "(prefill %.0f tok/s, restore %.0f MB/s)", store.fingerprint, left, prefill or 0,
                     (meter.rate or 0) / 2**20)
        if bad:
            self._seen(await asyncio.to_thread(store.forget, bad))
        if not loaded:
            return 0
        return await self.worker.call(self.cache.restore, loaded)

    async def save(self) -> None:
        """Write the in-memory entries not yet on disk, most recent first,
        within the disk budget; never raises."""
        started = time.perf_counter()
        try:
            manifest = await self._save(started)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("prefix cache %s: save failed: %s", self.fingerprint, describe_exception(exc))
            return
        self._seen(manifest)
        self.stats.last_save_seconds = round(time.perf_counter() - started, 4)
        log.info("prefix cache %s: saved (%d entries, %d MB on disk) in %.2fs", self.fingerprint,
                 len(manifest.entries), manifest.nbytes >> 20, self.stats.last_save_seconds)

    async def _save(self, started: float) -> Manifest:
        store = self.store
        snapshot: list[Snapshot] = await self.worker.call(_persistable_snapshot, self.cache)
        on_disk = {e.file: e for e in (await asyncio.to_thread(store.read_manifest)).entries}
        saved: list[StoredEntry] = []
        saved_tokens: list[tuple[int, ...]] = []
        total = 0
        for snap in snapshot:
            name = entry_name(snap.tokens)
            entry = on_disk.get(name)
            if entry is None:
                if total + snap.nbytes > store.max_bytes:
                    continue
                payload = await self.worker.call(encode_entry, snap.tokens, snap.cache, store.fingerprint)
                entry = await asyncio.to_thread(store.write_entry, name, payload, len(snap.tokens))
                del payload
            if total + entry.bytes > store.max_bytes:
                continue
            saved.append(entry)
            saved_tokens.append(snap.tokens)
            total += entry.bytes
        drop = _covered(on_disk.values(), saved_tokens)
        return await asyncio.to_thread(store.commit, saved, drop, time.perf_counter() - started)

    def _seen(self, manifest: Manifest) -> None:
        self.stats.disk_entries = len(manifest.entries)
        self.stats.disk_bytes = manifest.nbytes


def _persistable_snapshot(cache: PrefixCache) -> list[Snapshot]:
    return [s for s in cache.snapshot() if persistable(s.cache)]


def _covered(stored: Any, tokens: list[tuple[int, ...]]) -> set[str]:
    """Entries on disk that are a strict prefix of one being saved: a longer
    KV cache is trimmed down to them, so they only take space."""
    lengths = {e.tokens for e in stored}
    names = set()
    for seq in tokens:
        for n in lengths:
            if n < len(seq):
                names.add(entry_name(seq[:n]))
    return names & {e.file for e in stored}
