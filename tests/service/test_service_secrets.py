"""API keys never land in a unit or plist (a system one is world-readable):
they go into an owner-only file, and the daemon really authenticates with it."""

from __future__ import annotations

import os
import plistlib
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from support.daemon import daemon_process, free_port, write_registry

if TYPE_CHECKING:
    from conftest import FakeTools

KEYS = "sk-secret-one,sk-secret-two"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("platform", ["linux", "macos"])
def test_a_system_install_keeps_the_keys_out_of_the_world_readable_unit(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch, platform: str
) -> None:
    monkeypatch.setenv("MLXD_API_KEYS", KEYS)
    monkeypatch.setenv("MLXD_API_KEY", "sk-client-key")
    monkeypatch.setenv("SUDO_USER", "alice")
    result = cli("install", "--config", str(config_file), "--platform", platform, "--system", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "sk-secret" not in result.output and "sk-client-key" not in result.output
    if platform == "linux":
        secrets = Path("/etc/mlxd/mlxd.env")
        assert f"EnvironmentFile={secrets}" in result.stdout
    else:
        secrets = Path("/Library/Application Support/mlxd/com.mlxd.daemon.api-keys")
        assert f"<key>MLXD_API_KEYS_FILE</key>\n\t\t<string>{secrets}</string>" in result.stdout
    assert f"Would write {secrets} (mode 600): the API keys, not shown here" in result.stdout
    # The world-readable unit is written after its secrets file exists.
    lines = result.stdout.splitlines()
    assert lines.index(f"Would write {secrets} (mode 600): the API keys, not shown here") < next(
        i for i, line in enumerate(lines) if line.startswith("Would write ") and "(mode 644)" in line
    )
    assert fake_tools.argvs() == []


def test_a_user_install_writes_the_keys_to_an_owner_only_env_file(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch
) -> None:
    monkeypatch.setenv("MLXD_API_KEYS", KEYS)
    assert cli("install", "--config", str(config_file), "--platform", "linux").exit_code == 0
    unit = home / ".config" / "systemd" / "user" / "mlxd.service"
    secrets = home / ".config" / "mlxd" / "mlxd.env"
    assert "sk-secret" not in unit.read_text()
    assert f"EnvironmentFile={secrets}" in unit.read_text()
    assert secrets.read_text() == f"MLXD_API_KEYS='{KEYS}'\n" and mode(secrets) == 0o600

    fake_tools.clear()
    assert cli("install", "--config", str(config_file), "--platform", "linux").exit_code == 0
    assert fake_tools.argvs() == [], "same keys, same unit: nothing to do"

    # A new key alone changes only the secrets file, and the service restarts onto it.
    monkeypatch.setenv("MLXD_API_KEYS", "sk-rotated")
    result = cli("install", "--config", str(config_file), "--platform", "linux")
    assert result.exit_code == 0, result.output
    assert secrets.read_text() == "MLXD_API_KEYS='sk-rotated'\n" and mode(secrets) == 0o600
    assert ["systemctl", "--user", "restart", "mlxd.service"] in fake_tools.argvs()

    assert cli("uninstall", "--platform", "linux").exit_code == 0
    assert not secrets.exists() and not unit.exists()


def test_a_launchd_agent_gets_a_keys_file_the_daemon_reads(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch
) -> None:
    monkeypatch.setenv("MLXD_API_KEYS", KEYS)
    assert cli("install", "--config", str(config_file), "--platform", "macos").exit_code == 0
    plist = plistlib.loads((home / "Library" / "LaunchAgents" / "com.mlxd.daemon.plist").read_bytes())
    keys_file = Path(plist["EnvironmentVariables"]["MLXD_API_KEYS_FILE"])
    assert "MLXD_API_KEYS" not in plist["EnvironmentVariables"]
    assert keys_file.read_text() == "sk-secret-one\nsk-secret-two\n" and mode(keys_file) == 0o600


@pytest.mark.mlx
def test_the_daemon_requires_the_keys_from_its_keys_file(tmp_path: Path) -> None:
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    keys = tmp_path / "keys"
    keys.write_text("# for the service\nsk-from-file\n\n")
    keys.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "MLXD_API_KEYS"}
    env["MLXD_API_KEYS_FILE"] = str(keys)
    with daemon_process(registry, tmp_path, env=env) as d:
        assert httpx.get(f"{d.url}/v1/models", timeout=10).status_code == 401
        ok = httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer sk-from-file"}, timeout=10)
        assert ok.status_code == 200
        # Rotating a key: edit the file, reload.
        keys.write_text("sk-rotated\n")
        reload = httpx.post(f"{d.url}/v1/admin/reload", json={}, headers={"Authorization": "Bearer sk-from-file"}, timeout=60)
        assert reload.status_code == 200, reload.text
        old = httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer sk-from-file"}, timeout=10)
        new = httpx.get(f"{d.url}/v1/models", headers={"Authorization": "Bearer sk-rotated"}, timeout=10)
        assert (old.status_code, new.status_code) == (401, 200)


def test_an_unusable_keys_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    empty = tmp_path / "keys"
    empty.write_text("# nothing yet\n")
    for path, words in ((empty, "holds no key"), (tmp_path / "absent", "cannot read")):
        result = subprocess.run(
            [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(free_port()),
             "--api-keys-file", str(path)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "MLXD_STATE_DIR": str(tmp_path / "s")},
        )
        assert result.returncode == 2
        errors = [line for line in result.stderr.splitlines() if line.startswith("mlxd: error:")]
        assert len(errors) == 1 and str(path) in errors[0] and words in errors[0], result.stderr
        assert "Traceback" not in result.stderr
