"""Claude Code and Codex CLI, as a user runs them, against the demo registry
exactly as `mlxd demo` writes it (no tool_parser, no alias added by hand).

The settings are the ones docs/agents.md shows, read from it. Each CLI gets
its own HOME and no LD_PRELOAD (mlxd's OpenBLAS preload is
for mlxd, not for node). The CLIs come from npm: ``scripts/setup.sh --tests``
installs the versions below into ``.agents/`` when node is there.

Both ask for the demo's ``qwen-tiny`` (its plain ChatML template has no
place for tools: mlxd writes them into the prompt, mlxd/tools/fallback.py):
SmolLM2 answers sensibly but prefills an agent's prompt in minutes on a
loaded CPU. Claude Code's own system prompt and 24 tools come to ~48k
tokens with the tiny tokenizer, so its run replaces the system prompt and
keeps two tools (~2k tokens), which still go through the prompt and the
answer through the tool-call splitter. Codex runs with its defaults and
reads the model's metadata from mlxd's catalog (~4k tokens).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from support.daemon import daemon_process

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
# The settings docs/agents.md shows, used as shown (port and key swapped in).
DOC = (ROOT / "docs" / "agents.md").read_text()
DOC_URL, DOC_KEY = "http://127.0.0.1:8080", "sk-local"
KEY = "sk-local-agents"
# The demo's model the CLIs ask for (the docs name the one a user would).
MODEL = "qwen-tiny"
# What an agent CLI prints that mlxd's answers could have prevented.
WARNINGS = ("ERROR", "stream disconnected", "Model metadata", "Reconnecting", "API Error", "not found")


def doc_block(language: str, containing: str) -> str:
    return next(b for b in re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S) if containing in b)


def doc_shell(containing: str, url: str) -> tuple[dict[str, str], list[str]]:
    """The exports and the command of the docs' shell block that mentions ``containing``."""
    env, command = {}, []
    for line in doc_block("sh", containing).replace(DOC_URL, url).replace(DOC_KEY, KEY).splitlines():
        if line.startswith("export "):
            name, _, value = line[7:].partition("=")
            env[name] = value
        elif line.strip():
            command = shlex.split(line)
    return env, command


def cli(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(ROOT / ".agents" / "node_modules" / ".bin"))
    if found:
        return found
    if shutil.which("node") is None:
        pytest.skip(f"node is not installed, so `{name}` cannot be (install Node 20+, then scripts/setup.sh --tests)")
    pytest.fail(f"`{name}` is not installed: run scripts/setup.sh --tests (it installs it with npm)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from mlxd.cli.demo import write_demo

    tmp = tmp_path_factory.mktemp("clis")
    # The CLIs' homes lie apart from the watched registry folder.
    homes = tmp_path_factory.mktemp("cli-homes")
    registry = write_demo(tmp / "demo", sizes=("tiny",))
    with daemon_process(registry, tmp, "--api-key", KEY) as daemon:
        yield daemon, homes


def _env(home: Path, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    return {**env, "HOME": str(home), **extra}


def test_claude_code_completes_a_turn(served):
    daemon, homes = served
    claude = cli("claude")
    exports, command = doc_shell("ANTHROPIC_BASE_URL", daemon.url)
    assert command[:2] == ["claude", "-p"] and exports["ANTHROPIC_BASE_URL"] == daemon.url
    model = command.index("--model") + 1
    command[model] = MODEL
    run = subprocess.run(
        [claude, *command[1:], "--system-prompt", "You are a terse assistant.", "--tools", "Bash,Read"],
        env=_env(homes / "claude", **exports), cwd=homes, capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout[-2000:]}\nstderr:\n{run.stderr[-2000:]}"
    assert not [w for w in WARNINGS if w in run.stdout + run.stderr], run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.strip()
    pattern = re.compile(rf"messages model={MODEL} (?:caller=\S+ )?status=200 tokens_in=(\d+) .* stream=True")
    log = daemon.log(until=pattern)
    turn = pattern.search(log)
    assert turn, log[-3000:]
    # The two tools' schemas were written into the prompt (the same turn without tools is ~200 tokens).
    assert int(turn.group(1)) > 1500


def test_codex_completes_a_turn(served):
    daemon, homes = served
    codex = cli("codex")
    home = homes / "codex"
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    config = doc_block("toml", "wire_api").replace(DOC_URL, daemon.url)
    assert 'model = "default"' in config
    (home / ".codex" / "config.toml").write_text(config.replace('model = "default"', f'model = "{MODEL}"'))
    exports, command = doc_shell("codex exec", daemon.url)
    assert command[:2] == ["codex", "exec"]
    run = subprocess.run(
        [codex, *command[1:]],
        env=_env(home, **exports), cwd=homes, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert not [w for w in WARNINGS if w in output], output[-3000:]
    pattern = re.compile(rf"responses model={MODEL} (?:caller=\S+ )?status=200 tokens_in=(\d+) .* stream=True")
    turn = pattern.search(daemon.log(until=pattern))
    assert turn, daemon.log()[-3000:]
    # Its tools were written into the prompt (its agent tools, a namespace, too: ~8.5k tokens in all with
    # Codex 0.171), and mlxd's short base instructions replaced its own 17k characters (~4k tokens more).
    assert 1500 < int(turn.group(1)) < 10_000
