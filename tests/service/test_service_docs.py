"""The commands shown in docs/launchd.md and docs/systemd.md run as written."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.service_registry import service_registry

if TYPE_CHECKING:
    from conftest import FakeTools

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def code_lines(doc: Path, language: str) -> list[str]:
    blocks = [body for lang, body in FENCE.findall(doc.read_text()) if lang == language]
    return [line.strip() for body in blocks for line in body.splitlines() if line.strip()]


def service_commands(doc: Path) -> list[list[str]]:
    """Each `mlxd service ...` line as argv after `mlxd service`, `~` expanded as a shell would."""
    commands = []
    for line in code_lines(doc, "sh"):
        words = shlex.split(line)
        if words[:1] == ["sudo"]:
            words = words[1:]
        if words[:2] != ["mlxd", "service"]:
            continue
        commands.append([os.path.expanduser(w) if w.startswith("~/") else w for w in words[2:]])
    return commands


@pytest.mark.parametrize(("doc", "platform"), [("launchd.md", "macos"), ("systemd.md", "linux")])
def test_every_documented_command_runs_in_order(
    cli, home: Path, fake_tools: FakeTools, doc: str, platform: str
) -> None:
    commands = service_commands(DOCS / doc)
    assert len(commands) >= 6, "the walkthrough lost its commands"
    names = {c[0] for c in commands}
    assert {"install", "status", "logs", "restart", "uninstall"} <= names
    assert any("--dry-run" in c for c in commands)
    config = home / ".config" / "mlxd" / "models.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(service_registry())
    for extra in ("coder.yaml",):
        (config.parent / extra).write_text(service_registry())
    for args in commands:
        # A real --system run would write under /Library or /etc: the docs
        # must only show it as a dry run.
        assert "--system" not in args or "--dry-run" in args, args
        result = cli(*args, "--platform", platform)
        assert result.exit_code == 0, (args, result.output)
    ran = {argv[0] for argv in fake_tools.argvs()}
    assert ran >= ({"launchctl", "tail"} if platform == "macos" else {"systemctl", "journalctl"})


def test_the_launchctl_commands_in_the_walkthrough_are_what_install_runs(
    cli, home: Path, fake_tools: FakeTools
) -> None:
    documented = [
        line.replace("<uid>", str(os.getuid())).replace("~/", f"{home}/")
        for line in code_lines(DOCS / "launchd.md", "text")
        if line.startswith("launchctl ")
    ]
    config = home / ".config" / "mlxd" / "models.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(service_registry())
    result = cli("install", "--config", str(config), "--platform", "macos", "--dry-run")
    planned = [
        line.removeprefix("Would run: ")
        for line in result.stdout.splitlines()
        if line.startswith("Would run: ")
    ]
    assert documented == planned
