"""Saving the prefix cache on unload and restoring it on load, on real tiny
models and real files: the restored cache gives the cold output, and every
kind of damage is dropped, deleted and logged without failing the load."""

from __future__ import annotations

import errno
import json
import logging
import os
import time

import pytest
from prefix_cache.cache_support import (
    QUESTIONS,
    ask,
    chat,
    fingerprint_folder,
    greedy,
    manifest_of,
    open_engine,
    populate,
    prefix_stats,
    run,
    sessions,
    spec_for,
    unload,
)

from mlxd.engine.cache_store import files as store_files, folder as store_folder
from mlxd.engine.cache_store.folder import ORPHAN_GRACE_SECONDS
from mlxd.engine.fingerprint import model_fingerprint

pytestmark = pytest.mark.mlx

STORE_LOG = "mlxd.engine.cache_store"


def _restore(worker, spec, cache_dir, request=None):
    """Load (restoring), optionally ask one request, unload. Returns the
    stats right after the load and the answer."""

    async def main():
        engine = await open_engine(worker, spec, cache_dir)
        try:
            stats = dict(prefix_stats(engine))
            answer = await ask(engine, request) if request is not None else None
            return stats, answer
        finally:
            await unload(engine)

    return run(main())


def test_a_restored_cache_gives_the_cold_output(worker, qwen_tiny, tmp_path):
    spec = spec_for(qwen_tiny)
    first, second = greedy(messages=chat(QUESTIONS[0])), greedy(messages=chat(QUESTIONS[1]))
    cold = run(populate(worker, spec, tmp_path, [first, second]))
    before = [e["file"] for e in manifest_of(tmp_path)["entries"]]
    stats, (text, last) = _restore(worker, spec, tmp_path, first)
    assert stats["restored_entries"] == 2 and stats["memory_entries"] == 2
    assert stats["disk_entries"] == 2 and stats["disk_bytes"] > 0
    assert stats["last_restore_seconds"] is not None and stats["last_save_seconds"] is not None
    assert text == cold[0]
    assert last.cached_tokens > 0
    # `first` was used last: its (unchanged) entry now comes first.
    manifest = manifest_of(tmp_path)
    assert [e["file"] for e in manifest["entries"]] == before[::-1]
    assert manifest["fingerprint"] == fingerprint_folder(tmp_path).name


def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped bytes":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle : middle + 16]) + data[middle + 16 :])
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["truncated", "flipped bytes", "missing"])
def test_a_damaged_entry_is_dropped_deleted_and_logged(worker, qwen_tiny, tmp_path, caplog, how):
    spec = spec_for(qwen_tiny)
    requests = sessions(3)
    cold = run(populate(worker, spec, tmp_path, requests))
    folder = fingerprint_folder(tmp_path)
    newest = manifest_of(tmp_path)["entries"][0]["file"]
    _damage(folder / newest, how)

    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, (text, last) = _restore(worker, spec, tmp_path, requests[2])
    assert stats["restored_entries"] == 2
    assert newest in caplog.text
    assert newest not in [e["file"] for e in manifest_of(tmp_path)["entries"][1:]]
    # The damaged prompt is served cold, with the same answer.
    assert text == cold[2] and last.cached_tokens < 10


def _rewrite_manifest(cache_dir, change):
    path = fingerprint_folder(cache_dir) / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_an_entry_whose_token_count_disagrees_is_dropped(worker, qwen_tiny, tmp_path, caplog):
    spec = spec_for(qwen_tiny)
    run(populate(worker, spec, tmp_path, sessions(2)))
    victim = manifest_of(tmp_path)["entries"][0]

    def off_by_one(doc):
        doc["entries"][0]["tokens"] += 1

    _rewrite_manifest(tmp_path, off_by_one)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, _ = _restore(worker, spec, tmp_path)
    assert stats["restored_entries"] == 1
    assert "mismatch" in caplog.text
    assert not (fingerprint_folder(tmp_path) / victim["file"]).exists()


def test_an_entry_whose_kv_length_disagrees_with_its_tokens_is_dropped(worker, qwen_tiny, tmp_path, caplog):
    """A well-formed file whose KV holds one position fewer than its tokens:
    the checksum is right, the content is not."""
    import hashlib

    from mlxd.engine.cache_store.folder import entry_name
    from mlxd.engine.cache_entry import encode_tokens

    spec = spec_for(qwen_tiny)
    run(populate(worker, spec, tmp_path, sessions(1)))
    folder = fingerprint_folder(tmp_path)
    good = manifest_of(tmp_path)["entries"][0]

    def forge():
        import io

        from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache, trim_prompt_cache

        source = io.BytesIO((folder / good["file"]).read_bytes())
        source.name = "entry.safetensors"
        cache, meta = load_prompt_cache(source, return_metadata=True)
        tokens = list(range(1, good["tokens"] + 1))
        trim_prompt_cache(cache, 1)
        for layer in cache:  # cut the arrays too, as a writer with a bug would
            layer.keys, layer.values = layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :]
        meta = {**meta, "tokens": encode_tokens(tokens), "token_count": str(len(tokens))}
        out = io.BytesIO()
        save_prompt_cache(out, cache, meta)
        return entry_name(tokens), out.getvalue()

    name, payload = run(worker.call(forge))
    (folder / name).write_bytes(payload)

    def add(doc):
        doc["entries"].insert(0, {"file": name, "tokens": good["tokens"],
                                  "sha256": hashlib.sha256(payload).hexdigest(), "bytes": len(payload)})

    _rewrite_manifest(tmp_path, add)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, _ = _restore(worker, spec, tmp_path)
    assert stats["restored_entries"] == 1
    assert name in caplog.text and "mismatch" in caplog.text
    assert not (folder / name).exists()


def test_a_folder_from_another_model_is_never_read(worker, qwen_tiny, llama_tiny, tmp_path, caplog):
    run(populate(worker, spec_for(qwen_tiny), tmp_path, sessions(2)))
    qwen_folder = fingerprint_folder(tmp_path)
    llama_folder = qwen_folder.parent / model_fingerprint(llama_tiny, None)

    # 1. Renamed as is: the manifest names another fingerprint.
    qwen_folder.rename(llama_folder)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, (_, last) = _restore(worker, spec_for(llama_tiny), tmp_path, sessions(1)[0])
    assert stats["restored_entries"] == 0 and last.cached_tokens == 0
    assert "another model" in caplog.text
    # Only the entry llama itself saved afterwards is left.
    manifest = manifest_of(tmp_path)
    assert manifest["fingerprint"] == llama_folder.name and len(manifest["entries"]) == 1
    assert len(list(llama_folder.glob("*.safetensors"))) == 1


def test_entries_signed_by_another_model_are_never_read(worker, qwen_tiny, llama_tiny, tmp_path, caplog):
    run(populate(worker, spec_for(qwen_tiny), tmp_path, sessions(2)))
    qwen_folder = fingerprint_folder(tmp_path)
    llama_print = model_fingerprint(llama_tiny, None)
    # 2. The manifest forged to match: each entry still names its own model.
    _rewrite_manifest(tmp_path, lambda doc: doc.update(fingerprint=llama_print))
    qwen_folder.rename(qwen_folder.parent / llama_print)
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, _ = _restore(worker, spec_for(llama_tiny), tmp_path)
    assert stats["restored_entries"] == 0
    assert "different model" in caplog.text
    assert not list((qwen_folder.parent / llama_print).glob("*.safetensors"))


def test_a_corrupt_manifest_starts_empty_and_the_next_save_repairs_it(worker, qwen_tiny, tmp_path, caplog):
    spec = spec_for(qwen_tiny)
    run(populate(worker, spec, tmp_path, sessions(1)))
    (fingerprint_folder(tmp_path) / "manifest.json").write_text('{"format": 1, "entries": [')
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        stats, _ = _restore(worker, spec, tmp_path, sessions(2)[1])
    assert stats["restored_entries"] == 0 and "manifest" in caplog.text
    assert len(manifest_of(tmp_path)["entries"]) == 1


def test_disk_and_memory_bounds_keep_the_most_recent_entries(worker, qwen_tiny, tmp_path):
    requests = sessions(4)
    big = spec_for(qwen_tiny)
    run(populate(worker, big, tmp_path, requests))
    sizes = [e["bytes"] for e in manifest_of(tmp_path)["entries"]]
    assert len(sizes) == 4

    # Memory for two entries: the two most recent come back.
    small_memory = spec_for(qwen_tiny, max_bytes=int(max(sizes) * 2.5))
    stats, (_, newest) = _restore(worker, small_memory, tmp_path, requests[3])
    assert stats["restored_entries"] == 2 and newest.cached_tokens > 10
    assert len(manifest_of(tmp_path)["entries"]) == 4  # the disk still has all four
    _, (_, oldest) = _restore(worker, small_memory, tmp_path, requests[0])
    assert oldest.cached_tokens < 10

    # Disk for two entries: the next save keeps the two most recent.
    small_disk = spec_for(qwen_tiny, disk_max_bytes=int(max(sizes) * 2.5))
    stats, _ = _restore(worker, small_disk, tmp_path, requests[1])
    manifest = manifest_of(tmp_path)
    assert len(manifest["entries"]) == 2
    assert sum(e["bytes"] for e in manifest["entries"]) <= small_disk.prefix_cache.disk_max_bytes
    assert len(list(fingerprint_folder(tmp_path).glob("*.safetensors"))) == 2


def test_an_entry_the_disk_bound_leaves_out_is_not_written(worker, qwen_tiny, tmp_path):
    """An entry's file is a little larger than its arrays in memory (the
    header, its token ids): one that fitted by its memory size but not by
    its file's was written, left out of the manifest, and stayed on disk
    over the bound until a load at least 5 minutes later removed it."""
    requests = sessions(3)
    run(populate(worker, spec_for(qwen_tiny), tmp_path / "all", requests))
    newest, second = (e["bytes"] for e in manifest_of(tmp_path / "all")["entries"][:2])
    bound = newest + second - 1  # room for the newest, and the second's arrays but not its file
    run(populate(worker, spec_for(qwen_tiny, disk_max_bytes=bound), tmp_path / "bounded", requests))
    files = list(fingerprint_folder(tmp_path / "bounded").glob("*.safetensors"))
    assert [f.name for f in files] == [e["file"] for e in manifest_of(tmp_path / "bounded")["entries"]]
    assert sum(f.stat().st_size for f in files) <= bound


def test_leftovers_of_an_interrupted_save_are_removed_once_old(worker, qwen_tiny, tmp_path):
    spec = spec_for(qwen_tiny)
    run(populate(worker, spec, tmp_path, sessions(1)))
    folder = fingerprint_folder(tmp_path)
    old = folder / ".abc.safetensors.123.456.tmp"
    young = folder / "0123456789abcdef0123456789abcdef.safetensors"
    old.write_bytes(b"half an entry")
    young.write_bytes(b"another saver's entry, not yet in its manifest")
    stale = time.time() - ORPHAN_GRACE_SECONDS - 10
    os.utime(old, (stale, stale))
    stats, _ = _restore(worker, spec, tmp_path)
    assert stats["restored_entries"] == 1
    assert not old.exists() and young.exists()


def _small_disk(monkeypatch, cache_dir, capacity):
    """Writes under ``cache_dir`` fail as on a full disk once its files would pass ``capacity`` bytes."""
    def bounded(path, data):
        used = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
        if used + len(data) > capacity:
            raise OSError(errno.ENOSPC, "No space left on device")
        store_files.atomic_write(path, data)

    monkeypatch.setattr(store_folder, "atomic_write", bounded)


def test_a_disk_that_fills_mid_save_keeps_the_newest_entries_and_no_stray_files(
    worker, qwen_tiny, tmp_path, monkeypatch, caplog
):
    """A disk with room for one entry: the save wrote the newest, failed on
    the next, and kept neither (no manifest), leaving the written file named
    by nothing, in the way of every later save on that disk."""
    requests = sessions(2)
    run(populate(worker, spec_for(qwen_tiny), tmp_path / "roomy", requests))
    newest, second = (e["bytes"] for e in manifest_of(tmp_path / "roomy")["entries"])

    small = tmp_path / "small"
    _small_disk(monkeypatch, small, newest + 4096)  # the newest entry and a manifest
    with caplog.at_level(logging.WARNING, logger=STORE_LOG):
        run(populate(worker, spec_for(qwen_tiny), small, requests))
    assert "No space left" in caplog.text
    files = sorted(f.name for f in fingerprint_folder(small).glob("*.safetensors"))
    assert files == [e["file"] for e in manifest_of(small)["entries"]] and len(files) == 1
    stats, (_, last) = _restore(worker, spec_for(qwen_tiny), small, requests[1])
    assert stats["restored_entries"] == 1 and last.cached_tokens > 10

    # Room for both entries but not the manifest: nothing is kept, and nothing is left behind.
    full = tmp_path / "full"
    _small_disk(monkeypatch, full, newest + second)
    run(populate(worker, spec_for(qwen_tiny), full, requests))
    assert not list(fingerprint_folder(full).iterdir())


def test_persist_false_writes_nothing_and_a_failing_save_fails_nothing(worker, qwen_tiny, tmp_path, caplog):
    run(populate(worker, spec_for(qwen_tiny, persist=False), tmp_path, sessions(1)))
    assert not (tmp_path / "prefix").exists()

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache dir should be")

    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny), blocked)
        text, _ = await ask(engine, sessions(1)[0])
        await unload(engine)  # must not raise
        return text

    with caplog.at_level(logging.WARNING):
        assert run(main())
    assert "prefix cache" in caplog.text


def test_a_quantised_kv_cache_round_trips(worker, qwen_small, tmp_path):
    spec = spec_for(qwen_small, kv_bits=8)
    # Short: this model runs on the reference BLAS in tests.
    request = greedy(max_tokens=6, messages=chat(QUESTIONS[0], system="Answer from the code."))

    async def warm():
        engine = await open_engine(worker, spec, tmp_path)
        try:
            await ask(engine, request)
            return await ask(engine, request)
        finally:
            await unload(engine)

    warm_text, warm_last = run(warm())
    stats, (text, last) = _restore(worker, spec, tmp_path, request)
    assert stats["restored_entries"] == 1
    assert text == warm_text and last.cached_tokens == warm_last.cached_tokens > 0


def test_two_entries_on_one_model_folder_keep_each_others_saved_entries(worker, qwen_tiny, tmp_path):
    """Two registry entries on the same files share a fingerprint folder:
    loaded together, each one's save merges with the other's, never over it."""
    cache_dir = tmp_path / "cache"

    async def main():
        first = await open_engine(worker, spec_for(qwen_tiny, name="a"), cache_dir)
        second = await open_engine(worker, spec_for(qwen_tiny, name="b"), cache_dir)
        await ask(first, greedy(messages=chat(QUESTIONS[0])))
        await ask(second, greedy(messages=chat(QUESTIONS[1])))
        await unload(first)
        await unload(second)
        third = await open_engine(worker, spec_for(qwen_tiny, name="c"), cache_dir)
        try:
            _, one = await ask(third, greedy(messages=chat(QUESTIONS[0])))
            _, two = await ask(third, greedy(messages=chat(QUESTIONS[1])))
            return prefix_stats(third)["restored_entries"], one, two
        finally:
            await third.close()

    restored, one, two = run(main())
    assert len(manifest_of(cache_dir)["entries"]) == restored == 2
    # Each question's whole prompt comes back from the entry its own engine saved.
    assert one.cached_tokens == one.prompt_tokens - 1 and two.cached_tokens == two.prompt_tokens - 1
