"""What the saved prefix caches must never do to the user: answer from an
entry that does not fit the model, delete files mlxd did not write, or delete
another daemon's caches. Real tiny models, real saves, real files."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import pytest
from prefix_cache.cache_support import (
    ask,
    fingerprint_folder,
    open_engine,
    populate,
    prefix_stats,
    run,
    sessions,
    spec_for,
    unload,
)

from mlxd.daemon.engines import PrefixCacheHooks
from mlxd.engine.fingerprint import model_fingerprint
from mlxd.registry.model import ManagerSpec, Registry, ServerSpec

pytestmark = pytest.mark.mlx

STORE_LOG = "mlxd.engine.cache_store"


# --- 10: an entry that does not fit the loaded model ---------------------------------


def _rewrite_entries(worker, folder, change):
    """Rewrite every entry through ``change(cache) -> cache`` and recompute the
    manifest's sizes and checksums, as a buggy or hostile writer would."""
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    def rewrite(path):
        import io

        source = io.BytesIO(path.read_bytes())
        source.name = "entry.safetensors"
        cache, meta = load_prompt_cache(source, return_metadata=True)
        out = io.BytesIO()
        save_prompt_cache(out, change(cache), meta)
        return out.getvalue()

    doc = json.loads((folder / "manifest.json").read_text())
    for entry in doc["entries"]:
        payload = run(worker.call(rewrite, folder / entry["file"]))
        (folder / entry["file"]).write_bytes(payload)
        entry.update(sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload))
    (folder / "manifest.json").write_text(json.dumps(doc))
    return [e["file"] for e in doc["entries"]]


def _one_layer(cache):
    return cache[:1]


def _half_precision(cache):
    import mlx.core as mx

    for layer in cache:
        layer.keys, layer.values = layer.keys.astype(mx.float16), layer.values.astype(mx.float16)
    return cache


def _fewer_heads(cache):
    for layer in cache:
        layer.keys, layer.values = layer.keys[:, :1], layer.values[:, :1]
    return cache


@pytest.mark.parametrize("change", [_one_layer, _half_precision, _fewer_heads], ids=lambda f: f.__name__[1:])
def test_an_entry_that_does_not_fit_the_model_is_rejected(worker, qwen_tiny, tmp_path, caplog, change):
    spec = spec_for(qwen_tiny)
    requests = sessions(2)
    cold = run(populate(worker, spec, tmp_path, requests))
    folder = fingerprint_folder(tmp_path)
    files = _rewrite_entries(worker, folder, change)

    async def restore_and_ask():
        engine = await open_engine(worker, spec, tmp_path)
        try:
            stats = dict(prefix_stats(engine))
            answers = [await ask(engine, r) for r in requests]
            return stats, answers
        finally:
            await unload(engine)

    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, answers = run(restore_and_ask())
    assert stats["restored_entries"] == 0
    # Served cold, with the cold answers, not from the forged KV state.
    assert [text for text, _ in answers] == cold
    assert all(last.cached_tokens < 10 for _, last in answers)
    # Each rejected entry is named in the log with the reason, and deleted.
    for name in files:
        assert name in caplog.text
    assert "does not fit the model" in caplog.text
    # The cold answers were saved again in their place, and those fit.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        again, _ = run(restore_and_ask())
    assert again["restored_entries"] == len(files) and "does not fit" not in caplog.text


# --- 11: deleting never follows a symlink ----------------------------------------------


def _precious(folder):
    folder.mkdir(parents=True)
    (folder / "thesis.tex").write_text("years of work")
    (folder / "data.safetensors").write_bytes(b"not a cache")
    # A manifest naming another fingerprint: what makes mlxd clear a folder.
    (folder / "manifest.json").write_text(json.dumps({"format": 1, "fingerprint": "someone-else", "entries": []}))
    return sorted(p.name for p in folder.iterdir())


def test_a_symlinked_cache_folder_is_never_emptied(worker, qwen_tiny, tmp_path, caplog):
    victim = tmp_path / "home" / "work"
    before = _precious(victim)
    root = tmp_path / "cache" / "prefix"
    root.mkdir(parents=True)
    link = root / model_fingerprint(qwen_tiny, None)
    link.symlink_to(victim, target_is_directory=True)

    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        run(populate(worker, spec_for(qwen_tiny), tmp_path / "cache", sessions(1)))
    assert sorted(p.name for p in victim.iterdir()) == before
    assert (victim / "thesis.tex").read_text() == "years of work"
    assert "symlink" in caplog.text


def test_the_cache_dir_bound_never_follows_a_symlink(worker, qwen_tiny, tmp_path):
    victim = tmp_path / "home" / "work"
    before = _precious(victim)
    root = tmp_path / "cache" / "prefix"
    root.mkdir(parents=True)
    (root / "0123456789abcdef0123456789abcdef").symlink_to(victim, target_is_directory=True)
    old = 1_600_000_000
    for path in victim.iterdir():
        os.utime(path, (old, old))
    spec = spec_for(qwen_tiny, disk_max_bytes=1 << 20)

    _session_with_hooks(worker, spec, tmp_path / "cache", PrefixCacheHooks(), _registry(spec))
    assert sorted(p.name for p in victim.iterdir()) == before


def test_a_foreign_manifest_clears_only_what_mlxd_wrote(worker, qwen_tiny, llama_tiny, tmp_path):
    run(populate(worker, spec_for(qwen_tiny), tmp_path, sessions(1)))
    qwen_folder = fingerprint_folder(tmp_path)
    llama_folder = qwen_folder.parent / model_fingerprint(llama_tiny, None)
    qwen_folder.rename(llama_folder)
    (llama_folder / "notes.txt").write_text("mine")
    (llama_folder / "keep").mkdir()
    (llama_folder / "keep" / "inner.txt").write_text("mine too")

    run(populate(worker, spec_for(llama_tiny), tmp_path, sessions(1)))
    assert (llama_folder / "notes.txt").read_text() == "mine"
    assert (llama_folder / "keep" / "inner.txt").read_text() == "mine too"
    saved = json.loads((llama_folder / "manifest.json").read_text())
    assert saved["fingerprint"] == llama_folder.name and len(saved["entries"]) == 1


# --- 12: two daemons on one cache dir --------------------------------------------------


def _registry(*specs):
    return Registry(
        source_path=None, file_hash="", manager=ManagerSpec(memory_budget_bytes=1 << 34),
        server=ServerSpec(), models=tuple(specs),
    )


def _session_with_hooks(worker, spec, cache_dir, hooks, registry, requests=None):
    """One model session as a daemon runs it: answer, then the unload hooks
    (with that daemon's registry), then close."""

    async def main():
        engine = await open_engine(worker, spec, cache_dir)
        try:
            for request in requests or sessions(2):
                await ask(engine, request)
            await hooks.before_unload(spec, engine, "idle", registry)
        finally:
            await engine.close()

    run(main())


def test_two_daemons_on_one_cache_dir_keep_each_others_caches(worker, qwen_tiny, llama_tiny, tmp_path):
    qwen, llama = spec_for(qwen_tiny, name="qwen"), spec_for(llama_tiny, name="llama", disk_max_bytes=3 << 19)
    daemon_a = (PrefixCacheHooks(), _registry(qwen))
    daemon_b = (PrefixCacheHooks(), _registry(llama))
    qwen_folder = tmp_path / "prefix" / model_fingerprint(qwen_tiny, None)
    llama_folder = tmp_path / "prefix" / model_fingerprint(llama_tiny, None)

    _session_with_hooks(worker, qwen, tmp_path, *daemon_a)
    a_files = sorted(p.name for p in qwen_folder.iterdir())
    # Daemon B's bound (1.5 MB) holds its own folder but not both.
    _session_with_hooks(worker, llama, tmp_path, *daemon_b)
    assert llama_folder.is_dir()
    assert sorted(p.name for p in qwen_folder.iterdir()) == a_files
    # And the other way round: A's bound (256 MB) never needs B's folder gone.
    _session_with_hooks(worker, qwen, tmp_path, *daemon_a)
    assert llama_folder.is_dir() and qwen_folder.is_dir()


def test_a_daemon_still_bounds_its_own_folders(worker, qwen_tiny, llama_tiny, tmp_path):
    """The bound still works for what this daemon wrote: a model whose weights
    were replaced leaves a folder nothing reads, which goes first."""
    qwen, llama = spec_for(qwen_tiny, name="m", disk_max_bytes=3 << 19), spec_for(llama_tiny, name="m")
    hooks = (PrefixCacheHooks(), _registry(qwen))
    _session_with_hooks(worker, llama, tmp_path, *hooks)  # the old weights
    old_folder = tmp_path / "prefix" / model_fingerprint(llama_tiny, None)
    assert old_folder.is_dir()
    _session_with_hooks(worker, qwen, tmp_path, *hooks)  # replaced: 1.5 MB in all now
    assert not old_folder.exists()
    assert (tmp_path / "prefix" / model_fingerprint(qwen_tiny, None)).is_dir()
