"""docs/hot-reload.md: its commands run as written (with the test's port)
against a real `mlxd serve`, and what it says an error looks like is what
`mlxd reload` prints."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reload.harness import registry_doc, replace_atomically
from support.daemon import free_port, wait_until

pytestmark = pytest.mark.mlx

DOC = Path(__file__).resolve().parents[2] / "docs" / "hot-reload.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
KEY = "doc-key"
A = {"name": "a", "model": "qwen"}


def blocks(language: str) -> list[str]:
    return [
        line.strip()
        for lang, body in FENCE.findall(DOC.read_text())
        if lang == language
        for line in body.splitlines()
        if line.strip()
    ]


class Walkthrough:
    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.config = self.home / ".config" / "mlxd" / "models.yaml"
        self.config.parent.mkdir(parents=True)
        self.port = free_port()
        self.env = {
            **os.environ,
            "HOME": str(self.home),
            "MLXD_API_KEYS": KEY,
            "MLXD_API_KEY": KEY,
            "MLXD_PORT": str(self.port),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        self.edits = 0
        self.save()

    def save(self, **extra: object) -> None:
        self.edits += 1
        entry = {**A, "description": f"edit {self.edits}", **extra}
        replace_atomically(self.config, registry_doc(self.config.parent, [entry]))

    def status(self) -> dict:
        headers = {"Authorization": f"Bearer {KEY}"}
        return httpx.get(f"http://127.0.0.1:{self.port}/v1/status", headers=headers, timeout=10).json()

    def generation(self) -> int:
        return self.status()["config"]["generation"]

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        command = line.replace("127.0.0.1:8080", f"127.0.0.1:{self.port}")
        return subprocess.run(["bash", "-c", command], env=self.env, capture_output=True, text=True, timeout=120)

    @contextlib.contextmanager
    def serve(self, line: str) -> Iterator[None]:
        words = [os.path.expanduser(w) if w.startswith("~/") else w for w in shlex.split(line)]
        words = [w.replace(os.path.expanduser("~"), str(self.home)) for w in words]
        assert words[:2] == ["mlxd", "serve"]
        log = self.home / f"serve-{self.port}.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "mlxd", *words[1:], "--port", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env=self.env,
            )

        def up() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until(up, timeout=60, interval=0.1)
            yield
        finally:
            process.terminate()
            process.wait(timeout=60)


def test_the_documented_commands_reload_a_running_daemon_and_errors_look_as_shown(tmp_path):
    lines = blocks("sh")
    serve = [line for line in lines if line.startswith("mlxd serve")]
    commands = [line for line in lines if not line.startswith("mlxd serve")]
    assert len(serve) == 2 and len(commands) >= 5, "the walkthrough lost its commands"
    walk = Walkthrough(tmp_path)

    watching = next(line for line in serve if "--no-watch" not in line)
    with walk.serve(watching):
        walk.save()
        wait_until(lambda: walk.generation() == 2)
        assert walk.status()["config"]["last_reload"]["trigger"] == "watch"

    explicit = next(line for line in serve if "--no-watch" in line)
    walk.save()
    with walk.serve(explicit):
        expected = walk.generation()
        for line in commands:
            reloads = "reload" in line or "-HUP" in line
            if reloads:
                walk.save()
                expected += 1
            result = walk.run(line)
            assert result.returncode == 0, (line, result.stderr)
            wait_until(lambda: walk.generation() == expected)
            if line == "mlxd reload":
                assert result.stdout.startswith(f"generation {expected} applied: live: a"), result.stdout
            elif line.startswith(("curl", "mlxd reload --json")):
                document = json.loads(result.stdout)
                assert document["generation"] == expected, line
        triggers = [e["message"] for e in walk.status()["events"] if e["kind"] == "reload"]
        assert any("(signal)" in m for m in triggers) and any("(api)" in m for m in triggers)
        check_an_invalid_file_looks_as_documented_and_changes_nothing(walk)


def check_an_invalid_file_looks_as_documented_and_changes_nothing(walk: Walkthrough) -> None:
    before = walk.status()["config"]
    replace_atomically(
        walk.config,
        registry_doc(walk.config.parent, [A, {"name": "b", "model": "llama", "max_context": 0}]),
    )
    result = walk.run("mlxd reload")
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    shown = next(line for line in blocks("text") if line.startswith("mlxd: error:"))
    located = re.compile(r"\S+:\d+: ")
    assert located.sub("FILE:LINE: ", result.stderr.strip()) == located.sub("FILE:LINE: ", shown)
    assert str(walk.config) in result.stderr
    config = walk.status()["config"]
    assert config["generation"] == before["generation"] and config["file_hash"] == before["file_hash"]
    assert config["error"]["key"] == "models[1].max_context"
