"""`mlxd service install` without --config uses the default registry location,
and a dry run on a fresh machine shows the plan and how to create the file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.service_registry import service_registry

if TYPE_CHECKING:
    from conftest import FakeTools


@pytest.mark.parametrize(
    ("platform", "relative"),
    [("linux", ".config/mlxd/models.yaml"), ("macos", "Library/Application Support/mlxd/models.yaml")],
)
def test_a_dry_run_on_a_fresh_machine_plans_the_default_location(
    cli, home: Path, fake_tools: FakeTools, monkeypatch, platform: str, relative: str
) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    result = cli("install", "--platform", platform, "--dry-run")
    assert result.exit_code == 0, result.output
    default = home / relative
    assert str(default) in result.stdout  # the unit or plist runs with it
    note = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "does not exist yet" in note[0] and "mlxd demo" in note[0], result.stdout
    assert fake_tools.argvs() == [] and not (home / relative).parent.exists()


def test_install_without_config_refuses_a_missing_default_with_one_line(
    cli, home: Path, fake_tools: FakeTools, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    result = cli("install", "--platform", "linux")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert str(home / "xdg" / "mlxd" / "models.yaml") in result.stderr and "mlxd demo" in result.stderr
    assert fake_tools.argvs() == []


def test_install_without_config_uses_the_default_file_when_it_exists(
    cli, home: Path, fake_tools: FakeTools, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    config = home / "xdg" / "mlxd" / "models.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(service_registry(5))
    result = cli("install", "--platform", "linux")
    assert result.exit_code == 0, result.output
    unit = (home / ".config" / "systemd" / "user" / "mlxd.service").read_text()
    assert f"--config {config}" in unit and "TimeoutStopSec=35" in unit
