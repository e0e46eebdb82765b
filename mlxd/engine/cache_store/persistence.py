"""A save or restore of one engine's prefix cache (``PrefixCachePersistence``).

MLX work (bytes <-> arrays) runs on the worker, file I/O (``CacheStore``) in
a thread, one entry at a time, so neither the event loop nor other models'
decoding waits for the disk, and memory holds one serialised entry at a time.
On restore an entry whose size, checksum, fingerprint, token count, KV length
or layout (layers, head shapes, dtypes of the loaded model) does not match is
dropped with a warning and deleted. Errors are logged and never fail a load,
an unload or a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxd.engine.cache_store.folder import CacheStore, Manifest, StoredEntry, entry_name
from mlxd.engine import cache_layers
from mlxd.engine.cache_entry import CacheLayout, EntryError, decode_entry, encode_entry
from mlxd.engine.prefix_cache import PrefixCache, Snapshot
from mlxd.engine.restore_policy import RateMeter, Rates, decide
from mlxd.engine.worker import MlxWorker
from mlxd.errors import describe_exception

log = logging.getLogger(__name__)

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
        layout: Callable[[], CacheLayout] | None = None,
        prefill_rate: Callable[[], float | None] | None = None,
    ) -> None:
        self.store = store
        self.worker = worker
        self.cache = cache
        # Worker thread: the loaded model's KV layout, asked once per restore
        # that has entries to check (it runs the model on one token).
        self._layout = layout
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
        loaded: list[tuple[list[int], list[Any], str]] = []
        bad: set[str] = set()
        budget = self.cache.max_bytes
        layout = await self.worker.call(self._layout) if self._layout and manifest.entries else None
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
                decoded = await self.worker.call(decode_entry, payload, store.fingerprint, entry.tokens, layout)
            except EntryError as exc:
                log.warning("prefix cache %s: entry %s: %s; deleting it", store.fingerprint, entry.file, exc)
                bad.add(entry.file)
                continue
            del payload
            meter.record(entry.bytes, time.perf_counter() - started)
            loaded.append((decoded.tokens, decoded.cache, decoded.kind))
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
        # Files this save wrote: named by no manifest until the commit.
        written: set[str] = set()
        # Tokens of saved entries that can be trimmed: they cover their prefixes.
        covering: list[tuple[int, ...]] = []
        total = 0
        for snap in snapshot:
            name = entry_name(snap.tokens)
            entry = on_disk.get(name)
            if entry is None:
                if total + snap.nbytes > store.max_bytes:
                    continue
                payload = await self.worker.call(encode_entry, snap.tokens, snap.cache, store.fingerprint, snap.kind)
                if total + len(payload) > store.max_bytes:
                    # Its file (header, token ids) outgrows its arrays: written, it
                    # would lie on disk past the bound, named by no manifest.
                    continue
                try:
                    entry = await asyncio.to_thread(store.write_entry, name, payload, len(snap.tokens))
                except OSError as exc:
                    if not written:
                        raise
                    # A full disk (or quota): the most recent entries written
                    # so far are kept, rather than all lost and left on the
                    # disk as files no manifest names, in the way of the next save.
                    log.warning("prefix cache %s: saving stopped after %d new entries: %s", store.fingerprint,
                                len(written), describe_exception(exc))
                    break
                finally:
                    del payload
                written.add(entry.file)
            if total + entry.bytes > store.max_bytes:
                continue
            saved.append(entry)
            if snap.trimmable:
                covering.append(snap.tokens)
            total += entry.bytes
        drop = _covered(on_disk.values(), covering)
        try:
            return await asyncio.to_thread(store.commit, saved, drop, time.perf_counter() - started)
        except OSError:
            # No manifest names them: they would only take the space a later save needs.
            await asyncio.to_thread(store.discard, written)
            raise

    async def clear(self) -> int:
        """Forget every saved entry (an operator cleared the cache): the next
        load restores none of them. Returns how many were removed."""
        return await forget_saved(self.store, self._seen)

    def _seen(self, manifest: Manifest) -> None:
        self.stats.disk_entries = len(manifest.entries)
        self.stats.disk_bytes = manifest.nbytes


async def forget_saved(store: CacheStore, seen: Callable[[Manifest], None] = lambda _: None) -> int:
    """Remove every entry of ``store``'s folder (manifest and files)."""
    manifest = await asyncio.to_thread(store.read_manifest)
    if not manifest.entries:
        return 0
    seen(await asyncio.to_thread(store.forget, {e.file for e in manifest.entries}))
    log.info("prefix cache %s: %d saved entries cleared", store.fingerprint, len(manifest.entries))
    return len(manifest.entries)


def _persistable_snapshot(cache: PrefixCache) -> list[Snapshot]:
    return [s for s in cache.snapshot() if cache_layers.persistable(s.cache)]


def _covered(stored: Any, tokens: list[tuple[int, ...]]) -> set[str]:
    """Entries on disk that are a strict prefix of a trimmable one being
    saved: it is trimmed down to them, so they only take space. (A prefix of
    an entry that cannot be trimmed is a checkpoint and stays.)"""
    lengths = {e.tokens for e in stored}
    names = set()
    for seq in tokens:
        for n in lengths:
            if n < len(seq):
                names.add(entry_name(seq[:n]))
    return names & {e.file for e in stored}
