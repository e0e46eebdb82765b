"""The cache-dir bound never removes a cache that is in use, and counts only
what the manifests name (issue 24 item 5: during a soak it deleted the whole
persisted cache of two registered models, one while it was being restored).
Real tiny models, real saves, the daemon's own unload hooks."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from prefix_cache.cache_support import ask, open_engine, prefix_stats, run, sessions, spec_for
from support.daemon import wait_until

from mlxd.daemon.engines import PrefixCacheHooks
from mlxd.engine.cache_store.bound import enforce_total_bound
from mlxd.engine.cache_store.folder import USE, folder_lock
from mlxd.engine.fingerprint import model_fingerprint
from mlxd.registry.model import ManagerSpec, Registry, ServerSpec

pytestmark = pytest.mark.mlx

ENTRY = 700 << 10  # room for one tiny-model entry (~570 KB)


def _registry(*specs):
    return Registry(source_path=None, file_hash="", manager=ManagerSpec(memory_budget_bytes=1 << 34),
                    server=ServerSpec(), models=tuple(specs))


def _entries(folder):
    return [e["file"] for e in json.loads((folder / "manifest.json").read_text())["entries"]]


async def _session(worker, spec, cache_dir, hooks, registry, request):
    """Load, answer, the daemon's unload hooks (save, then the bound), close."""
    engine = await open_engine(worker, spec, cache_dir)
    try:
        await ask(engine, request)
        await hooks.before_unload(spec, engine, "idle", registry)
    finally:
        await engine.close()


def _in_use(root, fingerprint) -> bool:
    with folder_lock(root, fingerprint, blocking=False, kind=USE) as free:
        return not free


def test_a_loaded_models_folder_survives_another_models_bound(worker, qwen_tiny, llama_tiny, tmp_path):
    hooks = PrefixCacheHooks()
    x, y = spec_for(qwen_tiny, name="x", disk_max_bytes=ENTRY), spec_for(llama_tiny, name="y", disk_max_bytes=ENTRY)
    x_folder = tmp_path / "prefix" / model_fingerprint(qwen_tiny, None)
    first, second = sessions(2)

    async def main():
        await _session(worker, x, tmp_path, hooks, _registry(x, y), first)
        saved = _entries(x_folder)
        loaded = await open_engine(worker, x, tmp_path)  # x serves again, from its restored cache
        try:
            assert prefix_stats(loaded)["restored_entries"] == 1
            # A hot reload shrank x's disk bound while it is loaded: the dir is
            # over its total, and x's folder is the least recently saved.
            shrunk = spec_for(qwen_tiny, name="x", disk_max_bytes=1 << 10)
            await _session(worker, y, tmp_path, hooks, _registry(shrunk, y), second)
            assert _entries(x_folder) == saved
            assert all((x_folder / name).is_file() for name in saved)
        finally:
            await loaded.close()

    run(main())
    assert not _in_use(tmp_path / "prefix", x_folder.name)  # closing the engine let the folder go


def test_a_folder_is_kept_while_its_model_is_loading(worker, qwen_tiny, tmp_path):
    x = spec_for(qwen_tiny, name="x", disk_max_bytes=ENTRY)
    root, fingerprint = tmp_path / "prefix", model_fingerprint(qwen_tiny, None)
    run(_session(worker, x, tmp_path, PrefixCacheHooks(), _registry(x), sessions(1)[0]))

    # The worker is busy, so x's load waits there, after it took its folder.
    release, started = threading.Event(), threading.Event()

    def occupy():
        started.set()
        release.wait(60)

    blocker = threading.Thread(target=lambda: asyncio.run(worker.call(occupy)))
    blocker.start()
    assert started.wait(30)
    result = {}
    loader = threading.Thread(target=lambda: result.update(engine=run(open_engine(worker, x, tmp_path))))
    try:
        loader.start()
        wait_until(lambda: _in_use(root, fingerprint), timeout=30)
        # Another daemon's bound, with no room at all, and the folder its own.
        assert enforce_total_bound(root, 0, ours={fingerprint}) == []
    finally:
        release.set()
        blocker.join(60)
        loader.join(120)
    engine = result["engine"]
    try:
        assert prefix_stats(engine)["restored_entries"] == 1
    finally:
        run(engine.close())


def test_torn_temporary_files_do_not_count_toward_the_bound(worker, qwen_tiny, llama_tiny, tmp_path):
    hooks = PrefixCacheHooks()
    x, y = spec_for(qwen_tiny, name="x", disk_max_bytes=ENTRY), spec_for(llama_tiny, name="y", disk_max_bytes=ENTRY)
    registry = _registry(x, y)
    x_folder = tmp_path / "prefix" / model_fingerprint(qwen_tiny, None)
    first, second = sessions(2)
    run(_session(worker, x, tmp_path, hooks, registry, first))
    saved = _entries(x_folder)
    # What a save killed mid-write leaves: a temporary entry, not yet old
    # enough to be cleared as an orphan, larger than the whole bound.
    (x_folder / f".{'ab' * 16}.safetensors.4242.17.tmp").write_bytes(b"\0" * (2 * ENTRY))
    run(_session(worker, y, tmp_path, hooks, registry, second))
    assert _entries(x_folder) == saved
