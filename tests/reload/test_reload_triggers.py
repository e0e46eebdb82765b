"""How the file gets changed must not matter: every way editors and
configuration managers save a file is one reload, and a file that vanishes
for good is a visible error while the old registry keeps serving. Also the
server section: what applies live, what needs a restart, what CLI/env
overrides keep."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from reload.harness import registry_doc, reloading_daemon, replace_atomically
from support.daemon import wait_until

pytestmark = pytest.mark.mlx

A = {"name": "a", "model": "qwen"}
C = {"name": "c", "model": "llama"}


def save_in_place(path: Path, text: str) -> None:
    """nano, or vim with backupcopy=yes: truncate and write the same inode."""
    with open(path, "w") as handle:
        handle.write(text)


def save_delete_then_create(path: Path, text: str) -> None:
    """Some sync tools: the file is gone for a moment, then back."""
    path.unlink()
    time.sleep(0.05)
    path.write_text(text)


def save_by_symlink_swap(path: Path, text: str) -> None:
    """Configuration managers: write a new version, repoint the link atomically."""
    version = path.parent / "versions" / f"v{time.monotonic_ns()}.yaml"
    version.write_text(text)
    link = path.with_name(".models.yaml.link")
    link.symlink_to(version)
    os.replace(link, path)


def save_by_folder_swap(path: Path, text: str) -> None:
    """Kubernetes ConfigMaps: models.yaml -> ..data/models.yaml, and ``..data``
    is a symlink to a timestamped folder that is swapped, then the old one removed."""
    data = path.parent / "..data"
    old = data.resolve()
    fresh = path.parent / f"..{time.monotonic_ns()}"
    fresh.mkdir()
    (fresh / "models.yaml").write_text(text)
    link = path.parent / "..data_tmp"
    link.symlink_to(fresh.name)
    os.replace(link, data)
    (old / "models.yaml").unlink()
    old.rmdir()


def layout(tmp_path: Path, style, text: str) -> Path:
    """The registry as ``style`` leaves it on disk, holding ``text``."""
    path = tmp_path / "models.yaml"
    if style is save_by_symlink_swap:
        (tmp_path / "versions").mkdir()
        first = tmp_path / "versions" / "v0.yaml"
        first.write_text(text)
        path.symlink_to(first)
    elif style is save_by_folder_swap:
        (tmp_path / "..v0").mkdir()
        (tmp_path / "..v0" / "models.yaml").write_text(text)
        (tmp_path / "..data").symlink_to("..v0")
        path.symlink_to("..data/models.yaml")
    else:
        path.write_text(text)
    return path


STYLES = [replace_atomically, save_in_place, save_delete_then_create, save_by_symlink_swap, save_by_folder_swap]


@pytest.mark.parametrize("style", STYLES, ids=lambda s: s.__name__)
def test_every_way_of_saving_is_one_reload_and_never_an_error(tmp_path, style):
    registry = layout(tmp_path, style, registry_doc(tmp_path, [A]))
    with reloading_daemon(registry, tmp_path) as d:
        for generation, models in ((2, [A, C]), (3, [A])):
            style(registry, registry_doc(tmp_path, models))
            d.wait_generation(generation)
            wait_until(lambda: {m["name"] for m in d.status()["models"]} == {m["name"] for m in models})
        assert d.chat("a").status_code == 200
        messages = [e["message"] for e in d.reload_events()]
        assert not any("rejected" in m for m in messages), messages
        assert len([m for m in messages if "applied" in m]) == 2, messages


def test_file_missing_for_good_is_an_error_until_it_returns(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A]))
    with reloading_daemon(registry, tmp_path) as d:
        before = d.chat("a").json()["choices"][0]["message"]["content"]
        text = registry.read_text()
        registry.unlink()
        error = d.wait_error()
        assert error["file"] == str(registry) and "not found" in error["message"]
        assert d.chat("a").json()["choices"][0]["message"]["content"] == before
        assert d.status()["config"]["generation"] == 1
        registry.write_text(text)
        wait_until(lambda: d.config()["error"] is None)
        assert d.config()["last_reload"]["outcome"] == "unchanged"


def test_touching_the_file_or_writing_a_neighbour_changes_nothing(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A]))
    with reloading_daemon(registry, tmp_path) as d:
        os.utime(registry)
        (tmp_path / "notes.txt").write_text("unrelated")
        # A real change afterwards proves the watcher was listening all along.
        replace_atomically(registry, registry_doc(tmp_path, [A, C]))
        d.wait_generation(2)
        assert [e["message"].split(":")[0] for e in d.reload_events()] == ["generation 2 applied (watch)"]


def test_watching_off_leaves_reloads_to_explicit_triggers(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A]))
    with reloading_daemon(registry, tmp_path, watch=False) as d:
        replace_atomically(registry, registry_doc(tmp_path, [A, C]))
        assert d.reloader._watcher is None
        report = d.reload().json()
        assert report["outcome"] == "applied" and report["generation"] == 2 and report["trigger"] == "api"
        assert d.chat("c").status_code == 200


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_keys_and_limits_apply_live_and_a_new_address_needs_a_restart(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A], server={"api_keys": ["old-key"]}))
    with reloading_daemon(registry, tmp_path) as d:
        chat = {"model": "a", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20}
        assert httpx.post(f"{d.url}/v1/chat/completions", json=chat, headers=auth("old-key"), timeout=60).status_code == 200
        server = {"api_keys": ["new-key"], "max_request_tokens": 10, "default_max_tokens": 5, "host": "localhost", "port": 1}
        replace_atomically(registry, registry_doc(tmp_path, [A], server=server))
        wait_until(lambda: d.ctx.config.generation == 2)
        report = d.ctx.config.last_reload
        assert report["server"]["needs_restart"] == ["host"]
        assert report["server"]["overridden"] == ["port"], "the test daemon's --port wins"
        assert set(report["server"]["applied"]) == {"api_keys", "max_request_tokens", "default_max_tokens"}
        assert httpx.post(f"{d.url}/v1/chat/completions", json=chat, headers=auth("old-key"), timeout=60).status_code == 401
        limited = httpx.post(f"{d.url}/v1/chat/completions", json=chat, headers=auth("new-key"), timeout=60)
        assert limited.status_code == 400 and limited.json()["error"]["param"] == "max_tokens"
        status = httpx.get(f"{d.url}/v1/status", headers=auth("new-key"), timeout=10).json()
        assert status["daemon"]["bind"]["host"] == "127.0.0.1", "still where it listens"
        assert any("needs restart: host" in e["message"] for e in status["events"] if e["kind"] == "reload")


def test_a_key_rotated_in_its_key_file_applies_without_a_reload(tmp_path):
    # A leaked key revoked by rewriting its file used to keep working until the next reload.
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "ops.key").write_text("ops-old\n")
    keys_file = secrets / "keys.txt"
    keys_file.write_text("flat-old\n")
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A]) + "apps:\n  - {name: ops, key_file: secrets/ops.key, admin: true}\n")
    chat = {"model": "a", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

    def status_of(key: str) -> int:
        return httpx.post(f"{d.url}/v1/chat/completions", json=chat, headers=auth(key), timeout=60).status_code

    with reloading_daemon(registry, tmp_path, api_keys_file=keys_file) as d:
        assert status_of("ops-old") == 200
        replace_atomically(secrets / "ops.key", "ops-new\n")
        wait_until(lambda: d.ctx.config.generation == 2)
        assert (status_of("ops-old"), status_of("ops-new")) == (401, 200)
        assert d.ctx.config.last_reload["trigger"] == "watch"
        # The daemon's own keys file is watched too (its keys are the flat ones, beside the apps).
        assert d.reloader.key_files() == (secrets / "ops.key", keys_file)
        assert status_of("flat-old") == 200
        save_in_place(keys_file, "flat-new\n")
        wait_until(lambda: d.ctx.config.generation == 3)
        assert d.ctx.config.last_reload["trigger"] == "watch"
        assert d.ctx.config.last_reload["summary"] == "server: api_keys"
        assert (status_of("flat-old"), status_of("flat-new")) == (401, 200)


def test_cli_and_environment_overrides_keep_winning_after_a_reload(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A], server={"api_keys": ["file-key"]}))
    with reloading_daemon(registry, tmp_path, api_keys="flag-key") as d:
        replace_atomically(registry, registry_doc(tmp_path, [A], server={"api_keys": ["file-key-2"]}))
        wait_until(lambda: d.ctx.config.generation == 2)
        assert d.ctx.config.last_reload["server"]["overridden"] == ["api_keys"]
        assert d.ctx.settings.server.api_keys == ("flag-key",)
        assert httpx.get(f"{d.url}/v1/models", headers=auth("flag-key"), timeout=10).status_code == 200
        assert httpx.get(f"{d.url}/v1/models", headers=auth("file-key-2"), timeout=10).status_code == 401


def test_lowered_budget_evicts_the_least_recently_used_idle_model(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A, C]))
    with reloading_daemon(registry, tmp_path) as d:
        assert d.chat("a").status_code == 200
        assert d.chat("c").status_code == 200
        sizes = {m["name"]: m["memory"]["estimated_bytes"] for m in d.status()["models"]}
        budget = sum(sizes.values()) - 1
        replace_atomically(registry, registry_doc(tmp_path, [A, C], manager={"memory_budget": f"{budget}B"}))
        config = d.wait_generation(2)
        assert config["last_reload"]["manager"] == ["memory_budget_bytes"]
        wait_until(lambda: d.model("a")["state"] == "unloaded")
        assert d.model("c")["state"] == "loaded"
        assert d.status()["memory"]["budget_bytes"] == budget
        evictions = [e for e in d.status()["events"] if e["model"] == "a" and e["kind"] == "unload"]
        assert evictions and "budget lowered" in evictions[-1]["message"]
