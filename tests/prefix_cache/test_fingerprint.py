"""Which cache folder a model reads: everything that changes the KV values
changes the fingerprint; the folder's location does not. And the manager-wide
bound on the cache dir."""

from __future__ import annotations

import json
import os
import shutil
import struct
import time

import pytest

from mlxd.engine.cache_store.bound import enforce_total_bound
from mlxd.engine.fingerprint import CACHE_FORMAT_VERSION, model_fingerprint
from mlxd.factory import ModelRecipe, build_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    source = build_model(ModelRecipe(arch="qwen2", size="tiny"))
    copy = tmp_path_factory.mktemp("model") / "qwen"
    shutil.copytree(source, copy)
    return copy


def _edited(folder, tmp_path, name, edit):
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    path = copy / name
    path.write_bytes(edit(path.read_bytes()))
    return copy


def _json_edit(change):
    def edit(raw: bytes) -> bytes:
        doc = json.loads(raw)
        change(doc)
        return json.dumps(doc).encode()

    return edit


def test_the_same_files_anywhere_share_a_fingerprint(folder, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(folder, moved)
    assert model_fingerprint(moved, None) == model_fingerprint(folder, None)


def test_kv_quantisation_changes_it(folder):
    prints = {model_fingerprint(folder, bits) for bits in (None, 4, 8)}
    assert len(prints) == 3


def test_other_weights_of_the_same_shapes_change_it(folder):
    # Same architecture, sizes and safetensors header; only the values differ.
    other = build_model(ModelRecipe(arch="qwen2", size="tiny", seed=2))
    assert model_fingerprint(other, None) != model_fingerprint(folder, None)


@pytest.mark.parametrize(
    ("name", "edit"),
    [
        ("config.json", _json_edit(lambda d: d.update(rope_theta=d.get("rope_theta", 10000.0) * 2))),
        ("tokenizer.json", lambda raw: raw.replace(b'"<|im_end|>"', b'"<|im_stop|>"', 1)),
        ("tokenizer_config.json", _json_edit(lambda d: d.update(chat_template=d["chat_template"] + " "))),
    ],
    ids=["config", "tokenizer", "chat template"],
)
def test_config_tokenizer_and_chat_template_change_it(folder, tmp_path, name, edit):
    assert model_fingerprint(_edited(folder, tmp_path, name, edit), None) != model_fingerprint(folder, None)


def test_a_separate_chat_template_file_changes_it(folder, tmp_path):
    copy = tmp_path / "with-template"
    shutil.copytree(folder, copy)
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    assert model_fingerprint(copy, None) != model_fingerprint(folder, None)


def _tensors(weights):
    raw = weights.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    return {k: (8 + size + v["data_offsets"][0], 8 + size + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"}


def test_new_values_in_any_one_tensor_change_it(folder, tmp_path):
    """A fine-tune written over the old files that changed a few tensors
    (a LoRA fused into some attention layers): same names, shapes and
    header, new values in those tensors only. Sampling blocks spread over
    the file missed most of these, and the old model's KV was restored."""
    before = model_fingerprint(folder, None)
    copy = tmp_path / "tuned"
    shutil.copytree(folder, copy)
    [weights] = copy.glob("*.safetensors")
    original = weights.read_bytes()
    missed = []
    for name, (start, end) in _tensors(weights).items():
        tuned = bytearray(original)
        tuned[start:end] = bytes(b ^ 0x01 for b in tuned[start:end])
        weights.write_bytes(bytes(tuned))
        if model_fingerprint(copy, None) == before:
            missed.append(name)
    assert missed == []


def test_a_folder_without_weights_has_none(tmp_path):
    import asyncio

    from mlxd.engine.loader import _fingerprint
    from mlxd.registry.model import ModelSpec

    (tmp_path / "config.json").write_text("{}")
    # What the loader sees: no fingerprint, so the model runs without a
    # persisted prefix cache instead of failing its load.
    spec = ModelSpec(name="bare", path=tmp_path, source=str(tmp_path))
    assert asyncio.run(_fingerprint(spec)) is None
    with pytest.raises(OSError, match="no .safetensors weights"):
        model_fingerprint(tmp_path, None)


def _saved_folder(folder, stem, saved_at):
    """A fingerprint folder with one 1000-byte entry its manifest names, saved at ``saved_at``."""
    folder.mkdir(parents=True)
    entry = stem * 16 + ".safetensors"
    (folder / entry).write_bytes(b"x" * 1000)
    (folder / "manifest.json").write_text(json.dumps({
        "format": CACHE_FORMAT_VERSION, "fingerprint": folder.name, "saved_at": saved_at,
        "entries": [{"file": entry, "tokens": 10, "sha256": "0" * 64, "bytes": 1000}],
    }))
    os.utime(folder / "manifest.json", (saved_at, saved_at))


def test_the_cache_dir_bound_removes_the_least_recently_saved_folders(tmp_path):
    root = tmp_path / "prefix"
    for age, name in enumerate(["newest", "middle", "oldest"]):
        _saved_folder(root / name, "ab", time.time() - age * 1000)
    (root / ".locks").mkdir()
    ours = {"newest", "middle", "oldest"}

    assert enforce_total_bound(root, 2500, ours=ours, keep={"oldest"}) == ["middle"]
    assert sorted(p.name for p in root.iterdir()) == [".locks", "newest", "oldest"]
    assert enforce_total_bound(root, 2500, ours=ours) == []
    assert enforce_total_bound(root, 1000, ours=ours) == ["oldest"]


def test_the_cache_dir_bound_leaves_other_daemons_folders_until_they_are_stale(tmp_path):
    root = tmp_path / "prefix"
    for name, age in [("mine", 0), ("theirs", 3600), ("abandoned", 90 * 24 * 3600)]:
        _saved_folder(root / name, "cd", time.time() - age)

    # Over the bound: the stale folder goes first; another daemon's live one never.
    assert enforce_total_bound(root, 1000, ours={"mine"}) == ["abandoned"]
    assert enforce_total_bound(root, 0, ours={"mine"}) == ["mine"]
    assert (root / "theirs").is_dir()
