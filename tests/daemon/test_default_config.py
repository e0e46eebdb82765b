"""Without --config, mlxd finds its registry: MLXD_CONFIG, then the default
location (~/.config/mlxd/models.yaml, or $XDG_CONFIG_HOME), then the demo."""

import os
import subprocess
import sys

import httpx
import pytest
from support.daemon import daemon_process, write_registry

pytestmark = pytest.mark.mlx


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k not in ("MLXD_CONFIG", "XDG_CONFIG_HOME")}
    return {**env, "HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **extra}


def _run(*args, env):
    return subprocess.run([sys.executable, "-m", "mlxd", *args], capture_output=True, text=True, timeout=60, env=env)


def test_serve_without_config_serves_the_registry_at_the_default_location(tmp_path):
    folder = tmp_path / "xdg" / "mlxd"
    folder.mkdir(parents=True)
    write_registry(folder, [{"name": "from-default", "model": "qwen"}])
    with daemon_process(None, tmp_path, env=_env(tmp_path)) as d:
        names = [m["id"] for m in httpx.get(f"{d.url}/v1/models", timeout=10).json()["data"]]
        assert names == ["from-default"]
        status = httpx.get(f"{d.url}/v1/status", timeout=10).json()
        assert status["config"]["path"] == str(folder / "models.yaml")


def test_mlxd_config_wins_over_the_default_location(tmp_path):
    (tmp_path / "xdg" / "mlxd").mkdir(parents=True)
    write_registry(tmp_path / "xdg" / "mlxd", [{"name": "from-default", "model": "qwen"}])
    other = tmp_path / "other"
    other.mkdir()
    chosen = write_registry(other, [{"name": "from-env", "model": "qwen"}])
    result = _run("check", env=_env(tmp_path, MLXD_CONFIG=str(chosen)))
    assert result.returncode == 0 and "from-env [text]" in result.stdout


def test_check_without_a_path_uses_the_default_location_or_says_how_to_create_it(tmp_path):
    missing = _run("check", env=_env(tmp_path))
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    default = tmp_path / "xdg" / "mlxd" / "models.yaml"
    assert len(lines) == 1 and str(default) in lines[0] and "mlxd demo" in lines[0], missing.stderr

    # No default file, but the demo registry `mlxd serve` would serve: that is what check reads.
    demo = tmp_path / "cache" / "mlxd" / "demo"
    demo.mkdir(parents=True)
    write_registry(demo, [{"name": "demo-model", "model": "qwen"}])
    served = _run("check", env=_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert served.returncode == 0 and "demo-model [text]" in served.stdout, served.stderr
    assert "checking the demo registry `mlxd serve` would serve" in served.stderr

    default.parent.mkdir(parents=True)
    write_registry(default.parent, [{"name": "here", "model": "qwen"}])
    found = _run("check", env=_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert found.returncode == 0 and "here [text]" in found.stdout and str(default) in found.stdout


def test_serve_without_config_or_default_file_serves_the_demo_registry(tmp_path):
    # `make demo` runs `mlxd serve` bare: with nothing at the default location it
    # must keep serving the demo registry (here one already built in its folder).
    demo = tmp_path / "cache" / "mlxd" / "demo"
    demo.mkdir(parents=True)
    write_registry(demo, [{"name": "demo-model", "model": "qwen"}])
    with daemon_process(None, tmp_path, env=_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"))) as d:
        names = [m["id"] for m in httpx.get(f"{d.url}/v1/models", timeout=10).json()["data"]]
        assert names == ["demo-model"]
        looked = str(tmp_path / "xdg" / "mlxd" / "models.yaml")
        assert looked in d.log(until=looked)  # says where it looked


def test_check_takes_config_as_serve_does_and_warns_of_an_app_that_can_use_nothing(tmp_path):
    chosen = write_registry(tmp_path, [{"name": "chat", "model": "qwen"}])
    chosen.write_text(chosen.read_text() + "apps:\n  - {name: typo, key: none, models: [caht]}\n"
                      "  - {name: fine, key_sha256: " + "a" * 64 + ", models: [ch*]}\n")
    result = _run("check", "--config", str(chosen), env=_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "chat [text]" in result.stdout
    warned = [line for line in result.stdout.splitlines() if "match no model" in line]
    assert len(warned) == 1 and "(caht)" in warned[0], result.stdout
    both = _run("check", str(chosen), "--config", str(tmp_path / "other.yaml"), env=_env(tmp_path))
    assert both.returncode == 2 and "give one" in both.stderr


def test_demo_keeps_a_registry_it_did_not_write_and_names_a_folder_that_is_a_file(tmp_path):
    # docs/configuration.md points `mlxd demo` at ~/.config/mlxd: it replaced the user's own file there.
    mine = tmp_path / "models.yaml"
    mine.write_text("# my own registry\nmodels: []\n")
    kept = _run("demo", str(tmp_path), "--tiny-only", env=_env(tmp_path))
    assert kept.returncode == 2 and "--force" in kept.stderr and "Traceback" not in kept.stderr, kept.stderr
    assert mine.read_text() == "# my own registry\nmodels: []\n"
    not_a_folder = _run("demo", str(mine), "--tiny-only", env=_env(tmp_path))
    assert not_a_folder.returncode == 2 and "not a folder" in not_a_folder.stderr, not_a_folder.stderr


def test_demo_keeps_a_demo_registry_someone_edited(tmp_path):
    """`mlxd demo ~/.config/mlxd` writes "a registry to edit" (docs/configuration.md);
    run again, it replaced the edited file, the user's own models gone."""
    made = _run("demo", str(tmp_path), "--tiny-only", env=_env(tmp_path))
    assert made.returncode == 0, made.stderr
    registry = tmp_path / "models.yaml"
    again = _run("demo", str(tmp_path), "--tiny-only", env=_env(tmp_path))
    assert again.returncode == 0, again.stderr  # as written: replaced freely
    edited = registry.read_text().replace("models:\n", "models:\n  - {name: mine, path: /models/mine}\n", 1)
    registry.write_text(edited)
    kept = _run("demo", str(tmp_path), "--tiny-only", env=_env(tmp_path))
    assert kept.returncode == 2 and "--force" in kept.stderr, kept.stderr
    assert registry.read_text() == edited
    forced = _run("demo", str(tmp_path), "--tiny-only", "--force", env=_env(tmp_path))
    assert forced.returncode == 0 and "name: mine" not in registry.read_text()


@pytest.mark.parametrize("args", [["status", "--url", "http://256.1.1.1:80"], ["log", "--url", "http://[::1"],
                                  ["load", "m", "--url", "http://[::1"]])
def test_a_url_httpx_cannot_take_is_one_line_not_a_traceback(tmp_path, args):
    done = _run(*args, env=_env(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("mlxd: error: ") and "is not a URL mlxd can be reached at" in done.stderr


@pytest.mark.parametrize("text", ['models: [\n  - bad: "x\n', "- a\n- b\n"])
def test_status_with_a_registry_it_cannot_read_looks_at_the_default_address(tmp_path, text):
    config = tmp_path / "models.yaml"
    config.write_text(text)
    done = _run("status", "--config", str(config), env={**_env(tmp_path), "MLXD_PORT": "9"})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == "mlxd: error: no mlxd is running at http://127.0.0.1:9"


def test_load_and_unload_take_config_and_bad_numbers_are_usage_errors(tmp_path):
    config = write_registry(tmp_path, [{"name": "m", "model": "qwen"}], server={"port": 9})
    for action in ("load", "unload"):
        done = _run(action, "m", "--config", str(config), env=_env(tmp_path))
        assert done.returncode == 1 and done.stderr.strip() == "mlxd: error: no mlxd is running at http://127.0.0.1:9"
    for args in (["log", "-n", "0"], ["log", "-n", "5000"], ["status", "--watch", "--interval", "0"]):
        assert _run(*args, env=_env(tmp_path)).returncode == 2, args
