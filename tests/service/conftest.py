"""Fixtures for the service installer: a private HOME, a config, recording tools."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlxd.service.cli import service_app
from support.service_registry import service_registry

FAKE_TOOL = Path(__file__).with_name("fake_tool.py")
TOOLS = ("launchctl", "systemctl", "journalctl", "tail")


@dataclass
class Call:
    argv: list[str]
    # SHA-256 of the watched unit file when the command ran (None: absent).
    watched: str | None


@dataclass
class FakeTools:
    log: Path
    rules: Path
    bin_dir: Path
    monkeypatch: pytest.MonkeyPatch

    def calls(self) -> list[Call]:
        if not self.log.exists():
            return []
        lines = self.log.read_text(encoding="utf-8").splitlines()
        return [Call(**json.loads(line)) for line in lines]

    def argvs(self) -> list[list[str]]:
        return [call.argv for call in self.calls()]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)

    def respond(self, key: str, *, status: int = 0, stdout: str = "", stderr: str = "") -> None:
        """Make ``key`` ("launchctl bootstrap", "systemctl status", "tail") answer so."""
        rules = json.loads(self.rules.read_text()) if self.rules.exists() else {}
        rules[key] = {"status": status, "stdout": stdout, "stderr": stderr}
        self.rules.write_text(json.dumps(rules))

    def watch(self, path: Path) -> None:
        self.monkeypatch.setenv("FAKE_TOOLS_WATCH", str(path))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME is a fresh folder; no MLXD_* variable leaks in from the test run."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    for name in list(os.environ):
        if name.startswith("MLXD_"):
            monkeypatch.delenv(name)
    return folder


@pytest.fixture
def config_file(home: Path) -> Path:
    path = home / "mlxd" / "models.yaml"
    path.parent.mkdir()
    path.write_text(service_registry(45), encoding="utf-8")
    return path


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    """launchctl & co. on PATH are recording stand-ins; nothing real is driven."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    body = FAKE_TOOL.read_text(encoding="utf-8")
    for tool in TOOLS:
        script = bin_dir / tool
        script.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
        script.chmod(0o755)
    tools = FakeTools(
        log=tmp_path / "calls.jsonl",
        rules=tmp_path / "rules.json",
        bin_dir=bin_dir,
        monkeypatch=monkeypatch,
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TOOLS_LOG", str(tools.log))
    monkeypatch.setenv("FAKE_TOOLS_RULES", str(tools.rules))
    monkeypatch.delenv("FAKE_TOOLS_WATCH", raising=False)
    return tools


@pytest.fixture
def cli():
    """Runs ``mlxd service ...`` in-process; stdout and stderr kept apart."""
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(service_app, list(args), catch_exceptions=False)

    return invoke
