"""The systemd unit: parsed back line by line, and checked by systemd-analyze itself."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxd.service.spec import build_service_spec, build_target
from mlxd.service.systemd import SystemdManager, exec_word, unit_name
from support.service_registry import service_registry

SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Like configparser, but keeps repeated keys (Environment=) in order."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], defaultdict(list))
            continue
        assert current is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        current[key].append(value)
    return sections


def unescape_word(word: str, *, expands: str) -> str:
    """What systemd makes of one already-unquoted word.

    ``expands`` lists the characters systemd expands there ('%' specifiers
    everywhere, '$' variables in ExecStart=). Doubled, they are literal; alone,
    systemd would substitute something, which our renderer must never allow.
    """
    out, i = [], 0
    while i < len(word):
        ch = word[i]
        if ch in expands:
            assert word[i : i + 2] == ch * 2, f"systemd would expand {word[i:i+2]!r} in {word!r}"
            i += 1
        out.append(ch)
        i += 1
    return "".join(out)


def exec_start_argv(value: str) -> list[str]:
    return [unescape_word(w, expands="%$") for w in shlex.split(value)]


def environment_entries(values: list[str]) -> dict[str, str]:
    pairs = [unescape_word(shlex.split(v)[0], expands="%").split("=", 1) for v in values]
    return {k: v for k, v in pairs}


def render(home: Path, config: Path, environ: dict[str, str], *, system: bool = False, label: str = "com.mlxd.daemon") -> tuple[SystemdManager, str]:
    environ = {"HOME": str(home), **environ}
    target = build_target(label=label, system=system, environ=environ)
    spec = build_service_spec(target=target, config=config, environ=environ, python=sys.executable)
    manager = SystemdManager(target)
    return manager, manager.render(spec).decode()


def test_user_unit_says_how_to_run_stop_and_restart_the_daemon(home: Path, config_file: Path) -> None:
    manager, text = render(
        home, config_file, {"PATH": "/usr/bin:/bin", "MLXD_API_KEYS": "sk-1", "LANG": "C"}
    )
    assert manager.unit_path == home / ".config" / "systemd" / "user" / "mlxd.service"
    unit = parse_unit(text)
    service = unit["Service"]
    assert exec_start_argv(service["ExecStart"][0]) == [
        sys.executable, "-m", "mlxd", "serve", "--config", str(config_file)
    ]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartSec"] == ["10"]
    # A configuration error (exit 2) is not restarted every 10 s: restarting cannot fix it.
    assert service["RestartPreventExitStatus"] == ["2"]
    assert service["KillSignal"] == ["SIGTERM"]
    assert service["KillMode"] == ["mixed"]
    # grace 45 in the config: SIGKILL may only come after the drain could finish
    assert int(service["TimeoutStopSec"][0]) == 75
    # The key is in an owner-only file systemd reads, never in the unit.
    assert environment_entries(service["Environment"]) == {"PATH": "/usr/bin:/bin"}
    assert service["EnvironmentFile"] == [str(home / ".config" / "mlxd" / "mlxd.env")]
    assert "sk-1" not in text
    assert service["WorkingDirectory"] == [str(config_file.parent)]
    assert "User" not in service
    assert unit["Install"]["WantedBy"] == ["default.target"]


def test_unit_name_follows_the_label() -> None:
    assert unit_name("com.mlxd.daemon") == "mlxd.service"
    assert unit_name("com.mlxd.coder") == "com.mlxd.coder.service"


def test_system_unit_runs_as_the_sudo_user(home: Path, config_file: Path) -> None:
    manager, text = render(home, config_file, {"SUDO_USER": "alice"}, system=True)
    assert manager.unit_path == Path("/etc/systemd/system/mlxd.service")
    unit = parse_unit(text)
    assert unit["Service"]["User"] == ["alice"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1))
def test_any_argument_survives_exec_start_quoting(arg: str) -> None:
    assert exec_start_argv(exec_word(arg)) == [arg]


@pytest.mark.parametrize("arg", ["100%", "%h/models.yaml", "$HOME/x", "${HOME}", 'say "hi"', "a\\b", "two words", ";"])
def test_specifiers_variables_and_quotes_are_literal_in_exec_start(arg: str) -> None:
    assert exec_start_argv(exec_word(arg)) == [arg]


def test_environment_values_keep_percent_and_dollar(home: Path, config_file: Path) -> None:
    _, text = render(home, config_file, {"MLXD_NOTE": 'costs 5% of $BUDGET "now"'})
    env = environment_entries(parse_unit(text)["Service"]["Environment"])
    assert env["MLXD_NOTE"] == 'costs 5% of $BUDGET "now"'


# --- systemd's own parser -------------------------------------------------------------


def verify(unit_file: Path, *, user: bool, runtime_dir: Path) -> subprocess.CompletedProcess[str]:
    # The user manager needs XDG_RUNTIME_DIR; this sandbox has no login session
    # (without it verify fails with "Failed to lookup RuntimeDirectory path"),
    # so give it a private one, as pam_systemd would.
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    scope = ["--user"] if user else []
    return subprocess.run(
        [SYSTEMD_ANALYZE, *scope, "verify", str(unit_file)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime_dir), "HOME": str(runtime_dir)},
        timeout=60,
    )


def complaints_about(unit_file: Path, result: subprocess.CompletedProcess[str]) -> list[str]:
    """systemd logs bad lines as warnings and still exits 0: read what it says."""
    output = (result.stdout + result.stderr).splitlines()
    return [line for line in output if unit_file.name in line]


needs_systemd = pytest.mark.skipif(
    not Path(SYSTEMD_ANALYZE).exists(), reason="systemd-analyze not installed"
)


@needs_systemd
@pytest.mark.parametrize("system", [False, True])
def test_systemd_analyze_accepts_the_unit_without_a_warning(
    home: Path, tmp_path: Path, system: bool
) -> None:
    folder = home / "odd $HOME dir 100% \"quoted\""
    folder.mkdir()
    config = folder / "models.yaml"
    config.write_text(service_registry(5))
    environ = {"MLXD_X": 'a "b" 50% $c', "MLXD_API_KEYS": "sk-1"}
    manager, text = render(home, config, environ, system=system, label="com.mlxd.daemon")
    assert "EnvironmentFile=" in text
    unit_file = tmp_path / manager.unit
    unit_file.write_text(text)
    result = verify(unit_file, user=not system, runtime_dir=tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert complaints_about(unit_file, result) == []


@needs_systemd
def test_the_warning_check_catches_a_broken_unit(home: Path, config_file: Path, tmp_path: Path) -> None:
    # The check above would be worthless if systemd's warnings slipped past it.
    manager, text = render(home, config_file, {})
    unit_file = tmp_path / manager.unit
    unit_file.write_text(text.replace("KillMode=mixed", "KillMode=gently"))
    result = verify(unit_file, user=True, runtime_dir=tmp_path / "run")
    assert result.returncode == 0
    complaints = complaints_about(unit_file, result)
    assert complaints and "kill mode" in complaints[0].lower()
