"""The audit's hostile GGUF files (tests/support/bad_gguf.py): each is one
named error, never a crash. On `mlxd import` and `mlxd check` that is one
line and exit 2; in a registry it is one `failed` model with one log line
while the others serve, at start and on a hot reload alike."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import pytest
from support.bad_gguf import BAD_FILES, write_bad_gguf
from support.daemon import daemon_process, tiny_model, write_registry
from support.gguf_files import F16, write_gguf

from mlxd.errors import GGUFError
from mlxd.gguf import import_gguf
from mlxd.registry.loader import load_registry

pytestmark = pytest.mark.mlx

NAMES = list(BAD_FILES)


def _mlxd(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlxd", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _deep_config_folder(tmp_path):
    """A model folder whose config.json nests past Python's JSON parser: a
    RecursionError, not one of the errors the loader names itself."""
    folder = tmp_path / "deep-config"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_each_bad_file_is_a_named_error_and_leaves_nothing_behind(tmp_path, name):
    bad = write_bad_gguf(name, tmp_path)
    assert bad.stat().st_size < 16_000
    with pytest.raises(GGUFError, match=BAD_FILES[name][1]):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_commands_say_one_line_and_exit_2(tmp_path):
    nested = write_bad_gguf("nested-arrays", tmp_path)
    done = _mlxd("import", str(nested), str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"mlxd: error: {nested} is corrupt or truncated (metadata arrays nest deeper than 8 levels at byte 152)"
    ]

    models = [{"name": "good", "model": "qwen"}] + [
        {"name": n, "path": str(write_bad_gguf(n, tmp_path))} for n in NAMES
    ]
    registry = write_registry(tmp_path, models)
    checked = _mlxd("check", str(registry), cwd=tmp_path)
    assert checked.returncode == 2
    assert "Traceback" not in checked.stderr
    errors = checked.stderr.strip().splitlines()
    assert len(errors) == len(NAMES), checked.stderr
    for index, (name, line) in enumerate(zip(NAMES, errors), start=1):
        assert line.startswith(f"mlxd: error: {registry}:") and f"models[{index}].path" in line, line
        assert BAD_FILES[name][1] in line


def test_an_import_into_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    """A target under a file: the cleanup of the conversion lock raised
    NotADirectoryError over the real error, a traceback."""
    good = write_gguf(tiny_model("llama"), tmp_path / "good.gguf", F16)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for target in (blocker / "model", blocker):
        done = _mlxd("import", str(good), str(target), cwd=tmp_path)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == f"mlxd: error: cannot make the folder {target}: {blocker} is a file, not a folder"


def test_any_failure_reading_one_models_files_fails_that_model_alone(tmp_path):
    models = [{"name": "good", "model": "qwen"}, {"name": "deep", "path": str(_deep_config_folder(tmp_path))}]
    models += [{"name": n, "path": str(write_bad_gguf(n, tmp_path))} for n in NAMES]
    registry = load_registry(write_registry(tmp_path, models))
    by_name = {m.name: m for m in registry.models}
    assert by_name["good"].broken is None
    assert "RecursionError" in by_name["deep"].broken and "deep-config" in by_name["deep"].broken
    for name in NAMES:
        assert BAD_FILES[name][1] in by_name[name].broken, name
    assert len(registry.problems) == len(NAMES) + 1


def test_the_daemon_serves_on_with_bad_files_at_start_and_on_reload(tmp_path):
    at_start = [n for n in NAMES if n != "nested-arrays"]
    models = [{"name": "good", "model": "qwen"}, {"name": "deep", "path": str(_deep_config_folder(tmp_path))}]
    models += [{"name": n, "path": str(write_bad_gguf(n, tmp_path))} for n in at_start]
    registry = write_registry(tmp_path, models)
    chat = {"messages": [{"role": "user", "content": "Name three colours"}], "max_tokens": 4}
    with daemon_process(registry, tmp_path, "--no-watch") as d:
        assert httpx.post(f"{d.url}/v1/chat/completions", json={"model": "good", **chat}, timeout=60).status_code == 200
        states = {m["name"]: m for m in d.status()["models"]}
        for name in ["deep", *at_start]:
            assert states[name]["state"] == "failed", name

        nested = write_bad_gguf("nested-arrays", tmp_path)
        write_registry(tmp_path, [*models, {"name": "nested", "path": str(nested)}])
        report = httpx.post(f"{d.url}/v1/admin/reload", json={}, timeout=60).json()
        assert report["outcome"] == "applied" and report["models"]["nested"]["change"] == "added", report
        assert d.model("nested")["state"] == "failed"
        assert "nest deeper than 8 levels" in d.model("nested")["last_error"]
        reply = httpx.post(f"{d.url}/v1/chat/completions", json={"model": "nested", **chat}, timeout=60)
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "model_load_failed"
        assert httpx.post(f"{d.url}/v1/chat/completions", json={"model": "good", **chat}, timeout=60).status_code == 200
        log = d.log(until="nested-arrays.gguf")
    assert "Traceback" not in log
    # One line per bad model at start, and the reload's again plus its own.
    for name in ["deep", *at_start]:
        lines = [line for line in log.splitlines() if f"{name}.gguf" in line or (name == "deep" and "deep-config" in line)]
        assert len(lines) == 2, (name, lines)
    assert len([line for line in log.splitlines() if "nested-arrays.gguf" in line]) == 1


def test_tensor_shapes_that_disagree_with_the_metadata_are_refused_at_import(tmp_path):
    # The metadata says the feed-forward layers are twice as wide as the
    # tensors are: mlx-lm could not load the folder, so there is none.
    source = tmp_path / "source"
    shutil.copytree(tiny_model("qwen"), source)
    config = json.loads((source / "config.json").read_text())
    config["intermediate_size"] *= 2
    (source / "config.json").write_text(json.dumps(config))
    gguf = write_gguf(source, tmp_path / "wide.gguf", F16)
    with pytest.raises(GGUFError, match=r"wide\.gguf: its tensors do not match its metadata \(.*shape") as info:
        import_gguf(gguf, tmp_path / "out")
    assert not str(info.value).endswith("..")
    assert not (tmp_path / "out").exists()
