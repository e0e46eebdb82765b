"""A registry entry whose ``path`` is a .gguf file: converted once into the
manager's cache folder, keyed by the file's content, and served from there."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from mlxd.engine.fingerprint import model_fingerprint
from mlxd.registry.loader import load_registry
from support.daemon import daemon_in_thread, tiny_model
from support.gguf_files import Q8_0, write_gguf

pytestmark = pytest.mark.mlx


def _registry(tmp_path, gguf_path):
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({
        "manager": {"memory_budget": "1GB", "cache_dir": str(tmp_path / "cache")},
        "models": [{"name": "imported", "path": str(gguf_path), "max_context": 512}],
    }))
    return path


def test_a_gguf_path_is_converted_once_and_keyed_by_content(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "tiny.gguf", Q8_0)
    registry = _registry(tmp_path, gguf)

    first = load_registry(registry).models[0]
    assert first.path.parent == tmp_path / "cache" / "gguf"
    assert (first.path / "config.json").is_file() and first.source == str(gguf)
    written = (first.path / "model.safetensors").stat().st_mtime_ns
    fingerprint = model_fingerprint(first.path, None)

    again = load_registry(registry).models[0]
    assert again.path == first.path
    assert (again.path / "model.safetensors").stat().st_mtime_ns == written  # not converted again

    # The same bytes elsewhere share the conversion; other bytes get their own.
    copy = tmp_path / "elsewhere" / "tiny.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    assert load_registry(_registry(tmp_path, copy)).models[0].path == first.path
    (tmp_path / "other").mkdir()
    other = write_gguf(tiny_model("qwen-b"), tmp_path / "other" / "tiny.gguf", Q8_0)
    converted = load_registry(_registry(tmp_path, other)).models[0].path
    assert converted != first.path
    assert model_fingerprint(converted, None) != fingerprint


def test_check_shows_the_gguf_source_and_the_converted_folder(tmp_path):
    gguf = write_gguf(tiny_model("llama"), tmp_path / "tiny.gguf", Q8_0)
    done = subprocess.run([sys.executable, "-m", "mlxd", "check", str(_registry(tmp_path, gguf))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path_line = next(line for line in done.stdout.splitlines() if line.strip().startswith("path:"))
    assert str(tmp_path / "cache" / "gguf") in path_line and f"(from {gguf})" in path_line


def test_a_bad_gguf_path_is_a_located_problem_of_that_model(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 64)
    registry = load_registry(_registry(tmp_path, bad))
    assert "is corrupt or truncated" in registry.models[0].broken
    (problem,) = registry.problems
    assert problem.key == "models[0].path" and "is corrupt or truncated" in str(problem)


def test_the_daemon_serves_a_gguf_entry(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "tiny.gguf", Q8_0)
    with daemon_in_thread(_registry(tmp_path, gguf), tmp_path) as daemon, daemon.client() as client:
        reply = client.post("/v1/chat/completions", json={
            "model": "imported", "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 5, "temperature": 0,
        })
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1
