"""A process killed with SIGKILL in the middle of saving leaves nothing that
is later loaded wrong: a restore finds only complete entries, each with the
exact values that were saved, and drops none."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefix_cache import save_loop
from prefix_cache.cache_support import run

from mlxd.engine.cache_store.folder import CacheStore
from mlxd.engine.cache_store.persistence import PrefixCachePersistence
from mlxd.engine.prefix_cache import PrefixCache

pytestmark = pytest.mark.mlx

FINGERPRINT = "5a7e" * 8


def _committed(folder: Path) -> int:
    try:
        return len(json.loads((folder / "manifest.json").read_text())["entries"])
    except (OSError, ValueError, KeyError):
        return 0


def _save_and_kill(root: Path, first: int, when: str) -> None:
    folder = root / FINGERPRINT
    process = subprocess.Popen(
        [sys.executable, save_loop.__file__, str(root), FINGERPRINT, str(first)],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        # Let it commit at least two entries first, so there is something to keep.
        while _committed(folder) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if when == "mid-write":
            # A file is being written: an entry shorter than a full one, or a
            # temporary file (entries all have the same size here).
            while not _partial_files(folder) and time.monotonic() < deadline:
                time.sleep(0.0002)
        else:
            time.sleep(random.uniform(0, 0.2))
        assert process.poll() is None, "the save loop ended by itself"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def _partial_files(folder: Path) -> list[str]:
    try:
        full = json.loads((folder / "manifest.json").read_text())["entries"][0]["bytes"]
        sizes = [(p.name, p.stat().st_size) for p in folder.iterdir() if p.name != "manifest.json"]
    except (OSError, ValueError, KeyError, IndexError):
        return []
    return [name for name, size in sizes if size < full or name.endswith(".tmp")]


def _verify(cache: PrefixCache) -> list[tuple[int, bool]]:
    """Worker thread: every restored entry against what the loop wrote."""
    import mlx.core as mx

    results = []
    for snap in cache.snapshot():
        index = snap.tokens[0] // 10_000
        ok = list(snap.tokens) == save_loop.token_ids(index)
        for layer, c in enumerate(snap.cache):
            value = save_loop.expected_value(index, layer)
            ok = ok and bool(mx.all(c.keys == value).item()) and bool(mx.all(c.values == -value).item())
        results.append((index, ok))
    return results


def test_a_save_killed_at_any_point_restores_only_complete_entries(worker, tmp_path, caplog):
    root = tmp_path / "prefix"
    random.seed(7)
    for round_, when in enumerate(["mid-write", "random", "mid-write", "random"]):
        _save_and_kill(root, first=round_ * 1000, when=when)

        async def restore():
            store = CacheStore(root, FINGERPRINT, save_loop.DISK_MAX_BYTES)
            cache = PrefixCache(max_bytes=1 << 30)
            restored = await PrefixCachePersistence(store, worker, cache).restore()
            return restored, _committed(root / FINGERPRINT), await worker.call(_verify, cache)

        with caplog.at_level(logging.WARNING):
            restored, committed, checks = run(restore())
        assert restored == committed >= 2
        assert all(ok for _, ok in checks), checks
        assert "damaged" not in caplog.text and "missing" not in caplog.text and "mismatch" not in caplog.text
