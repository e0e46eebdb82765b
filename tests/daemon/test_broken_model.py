"""One model with bad files on disk must not take the others down: it is
`failed` with its reason, its requests get 503 `model_load_failed`, the rest
serve. Problems in the YAML itself stay fatal (tests/daemon/test_process.py)."""

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
from support.daemon import daemon_process, tiny_model, wait_until, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "Name three colours"}]


def _chat(url: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def _broken_folders(tmp_path):
    """A copy of a tiny model with corrupt weights, one with a bad config.json,
    and a folder that does not exist."""
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_model("qwen"), corrupt)
    (corrupt / "model.safetensors").write_bytes(b"\x00\x01 this is not a safetensors file" * 10)
    bad_config = tmp_path / "bad-config"
    shutil.copytree(tiny_model("llama"), bad_config)
    (bad_config / "config.json").write_text("{ not json")
    return corrupt, bad_config, tmp_path / "missing"


def _models(url: str) -> dict[str, dict]:
    return {m["name"]: m for m in httpx.get(f"{url}/v1/status", timeout=10).json()["models"]}


def test_a_model_with_broken_files_is_failed_while_the_others_serve(tmp_path):
    corrupt, bad_config, missing = _broken_folders(tmp_path)
    models = [
        {"name": "a", "model": "qwen"},
        {"name": "b", "model": "llama"},
        {"name": "c", "model": "qwen-b"},
        {"name": "corrupt", "path": str(corrupt)},
        {"name": "bad-config", "path": str(bad_config)},
        {"name": "missing", "path": str(missing)},
    ]
    registry = write_registry(tmp_path, models)
    with daemon_process(registry, tmp_path, "--no-watch") as d:
        for name in ("a", "b", "c"):
            assert _chat(d.url, name).status_code == 200, name

        status = httpx.get(f"{d.url}/v1/status", timeout=10).json()
        by_name = {m["name"]: m for m in status["models"]}
        assert by_name["corrupt"]["state"] == "failed"
        assert "not a valid safetensors file" in by_name["corrupt"]["last_error"]
        assert by_name["bad-config"]["state"] == "failed"
        assert "not valid JSON" in by_name["bad-config"]["last_error"]
        assert by_name["missing"]["state"] == "failed"
        assert "does not exist" in by_name["missing"]["last_error"]
        assert status["health"]["status"] == "degraded"
        assert any("corrupt" in p for p in status["health"]["problems"])

        for name in ("corrupt", "bad-config", "missing"):
            response = _chat(d.url, name)
            assert response.status_code == 503, name
            error = response.json()["error"]
            assert error["code"] == "model_load_failed" and error["type"] == "server_error"
            assert name in error["message"]
        # An operator's load is refused the same way, and nothing was loaded.
        assert httpx.post(f"{d.url}/v1/models/corrupt/load", json={}, timeout=30).status_code == 503
        assert _models(d.url)["corrupt"]["load_count"] == 0
        assert "Traceback" not in d.log()


def test_check_reports_broken_files_as_errors_with_file_and_line(tmp_path):
    corrupt, _, _ = _broken_folders(tmp_path)
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}, {"name": "corrupt", "path": str(corrupt)}])
    result = subprocess.run([sys.executable, "-m", "mlxd", "check", str(registry)],
                            capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("mlxd: error:")]
    assert len(errors) == 1, result.stderr
    line = registry.read_text().splitlines().index(f"- name: corrupt") + 2  # the path key
    assert f"{registry}:{line}: models[1].path" in errors[0]
    assert "not a valid safetensors file" in errors[0]
    assert "Traceback" not in result.stderr


def test_hot_reload_adds_a_broken_model_as_failed_and_a_fix_makes_it_serve(tmp_path):
    corrupt, _, _ = _broken_folders(tmp_path)
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    with daemon_process(registry, tmp_path, "--no-watch") as d:
        write_registry(tmp_path, [{"name": "a", "model": "qwen"}, {"name": "x", "path": str(corrupt)}])
        reload = httpx.post(f"{d.url}/v1/admin/reload", json={}, timeout=60)
        assert reload.status_code == 200, reload.text
        report = reload.json()
        assert report["outcome"] == "applied" and report["models"]["x"]["change"] == "added"
        assert any("x" in p["key"] or "models[1]" in p["key"] for p in report["problems"]), report
        assert _models(d.url)["x"]["state"] == "failed"
        assert _chat(d.url, "a").status_code == 200
        assert _chat(d.url, "x").status_code == 503

        shutil.copy(tiny_model("qwen") / "model.safetensors", corrupt / "model.safetensors")
        report = httpx.post(f"{d.url}/v1/admin/reload", json={}, timeout=60).json()
        assert report["problems"] == [], json.dumps(report)
        wait_until(lambda: _models(d.url)["x"]["state"] != "failed", timeout=10)
        assert _chat(d.url, "x").status_code == 200
