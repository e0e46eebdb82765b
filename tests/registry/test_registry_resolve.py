"""Local folders and Hugging Face repo ids (local cache only) -> model folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.loader import load_registry_text
from mlxd.registry.resolve import hf_hub_cache, looks_like_repo_id, resolve_model_dir


def fake_hf_repo(
    cache: Path, repo_id: str, make_model, revisions=("abc123",), main="abc123"
) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main,snapshots/<rev>}."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    for rev in revisions:
        make_model(repo / "snapshots" / rev)
    if main is not None:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(main + "\n")
    return repo


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HF_HUB_CACHE": "/a/hub"}, "/a/hub"),
        ({"HUGGINGFACE_HUB_CACHE": "/legacy"}, "/legacy"),
        ({"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/h/hub"),
        ({"HF_HUB_CACHE": "/a/hub", "HF_HOME": "/h"}, "/a/hub"),
        ({"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"),
        ({}, str(Path.home() / ".cache" / "huggingface" / "hub")),
    ],
)
def test_hub_cache_location_follows_huggingface_hub(env, expected):
    assert hf_hub_cache(env) == Path(expected)


@pytest.mark.parametrize(
    ("source", "is_repo"),
    [
        ("mlx-community/Qwen2.5-0.5B-Instruct-4bit", True),
        ("org/name", True),
        ("./org/name", False),
        ("/abs/path", False),
        ("~/models/x", False),
        ("a/b/c", False),
        ("just-a-folder", False),
        ("org/../x", False),
    ],
)
def test_what_counts_as_a_repo_id(source, is_repo):
    assert looks_like_repo_id(source) is is_repo


def test_repo_id_resolves_to_the_snapshot_refs_main_names(tmp_path, make_model):
    cache = tmp_path / "hub"
    repo = fake_hf_repo(
        cache, "org/model", make_model, revisions=("old111", "new222"), main="new222"
    )
    # Make the other snapshot newer on disk, so only refs/main can explain the pick.
    os.utime(repo / "snapshots" / "old111", (2_000_000_000, 2_000_000_000))
    found = resolve_model_dir("org/model", base_dir=tmp_path, env={"HF_HUB_CACHE": str(cache)})
    assert found == repo / "snapshots" / "new222"


def test_without_refs_main_the_newest_snapshot_is_used(tmp_path, make_model):
    cache = tmp_path / "hub"
    repo = fake_hf_repo(cache, "org/model", make_model, revisions=("aaa", "bbb"), main=None)
    os.utime(repo / "snapshots" / "aaa", (2_000_000_000, 2_000_000_000))
    os.utime(repo / "snapshots" / "bbb", (1_000_000_000, 1_000_000_000))
    found = resolve_model_dir("org/model", base_dir=tmp_path, env={"HF_HUB_CACHE": str(cache)})
    assert found == repo / "snapshots" / "aaa"


def test_hf_home_is_honoured(tmp_path, make_model):
    repo = fake_hf_repo(tmp_path / "hf" / "hub", "org/model", make_model)
    found = resolve_model_dir("org/model", base_dir=tmp_path, env={"HF_HOME": str(tmp_path / "hf")})
    assert found == repo / "snapshots" / "abc123"


def test_a_repo_not_in_the_cache_is_an_error_that_says_where_it_looked(tmp_path):
    cache = tmp_path / "hub"
    with pytest.raises(ConfigError) as caught:
        resolve_model_dir("org/missing", base_dir=tmp_path, env={"HF_HUB_CACHE": str(cache)})
    message = caught.value.detail
    assert str(cache) in message
    assert "allow_download: true" in message
    assert "huggingface-cli download org/missing" in message


def test_download_happens_only_when_allowed(tmp_path, make_model):
    cache = tmp_path / "hub"
    calls = []

    def downloader(repo_id: str, cache_dir: Path) -> Path:
        calls.append((repo_id, cache_dir))
        return fake_hf_repo(cache_dir, repo_id, make_model) / "snapshots" / "abc123"

    env = {"HF_HUB_CACHE": str(cache)}
    with pytest.raises(ConfigError):
        resolve_model_dir("org/new", base_dir=tmp_path, env=env, downloader=downloader)
    assert calls == []
    found = resolve_model_dir(
        "org/new", base_dir=tmp_path, env=env, allow_download=True, downloader=downloader
    )
    assert calls == [("org/new", cache)]
    assert (found / "config.json").is_file()
    # Once cached, resolution no longer downloads.
    resolve_model_dir(
        "org/new", base_dir=tmp_path, env=env, allow_download=True, downloader=downloader
    )
    assert len(calls) == 1


def test_an_incomplete_snapshot_is_rejected(tmp_path, make_model):
    cache = tmp_path / "hub"
    repo = fake_hf_repo(cache, "org/model", make_model)
    (repo / "snapshots" / "abc123" / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_dir("org/model", base_dir=tmp_path, env={"HF_HUB_CACHE": str(cache)})


def test_an_existing_local_folder_wins_over_a_repo_id(tmp_path, make_model):
    local = make_model(tmp_path / "org" / "model")
    fake_hf_repo(tmp_path / "hub", "org/model", make_model)
    found = resolve_model_dir(
        "org/model", base_dir=tmp_path, env={"HF_HUB_CACHE": str(tmp_path / "hub")}
    )
    assert found == local.resolve()


def test_registry_entries_resolve_repo_ids_from_the_cache(tmp_path, make_model):
    cache = tmp_path / "hub"
    repo = fake_hf_repo(cache, "mlx-community/Tiny-4bit", make_model)
    text = "models:\n  - name: tiny\n    path: mlx-community/Tiny-4bit\n"
    registry = load_registry_text(text, tmp_path / "models.yaml", env={"HF_HUB_CACHE": str(cache)})
    spec = registry.models[0]
    assert spec.path == repo / "snapshots" / "abc123"
    assert spec.source == "mlx-community/Tiny-4bit"


def test_relative_paths_resolve_against_the_registry_folder(tmp_path, make_model, monkeypatch):
    folder = make_model(tmp_path / "conf" / "weights" / "m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = "manager:\n  memory_budget: 1GB\nmodels:\n  - name: m\n    path: weights/m\n"
    registry = load_registry_text(text, tmp_path / "conf" / "models.yaml")
    assert registry.models[0].path == folder.resolve()


def test_home_relative_paths_expand(tmp_path, make_model, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = make_model(tmp_path / "models" / "m")
    found = resolve_model_dir("~/models/m", base_dir=Path("/nonexistent"))
    assert found == folder.resolve()
