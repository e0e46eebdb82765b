"""`mlxd service ...` drives launchctl/systemctl in the right order (recording stand-ins)."""

from __future__ import annotations

import hashlib
import os
import plistlib
import stat
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from support.service_registry import service_registry

if TYPE_CHECKING:
    from conftest import FakeTools

UID = os.getuid()
LABEL = "com.mlxd.daemon"
GUI = f"gui/{UID}"
SERVICE = f"{GUI}/{LABEL}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def all_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*"))


def agent_plist(home: Path) -> Path:
    return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def user_unit(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / "mlxd.service"


def install(cli, config: Path, platform: str, *extra: str):
    return cli("install", "--config", str(config), "--platform", platform, *extra)


# --- macOS: launchd ---------------------------------------------------------------------


def test_install_writes_the_agent_and_bootstraps_enables_kickstarts(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    result = install(cli, config_file, "macos")
    assert result.exit_code == 0, result.output
    plist = agent_plist(home)
    assert fake_tools.argvs() == [
        ["launchctl", "bootstrap", GUI, str(plist)],
        ["launchctl", "enable", SERVICE],
        ["launchctl", "kickstart", "-k", SERVICE],
    ]
    # The plist may hold MLXD_* secrets: owner-only.
    assert stat.S_IMODE(plist.stat().st_mode) == 0o600
    assert (home / "Library" / "Logs" / "mlxd").is_dir()
    assert "installed and started" in result.stdout


def test_installing_the_same_agent_twice_runs_nothing_the_second_time(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    assert install(cli, config_file, "macos").exit_code == 0
    before = sha256(agent_plist(home))
    fake_tools.clear()
    again = install(cli, config_file, "macos")
    assert again.exit_code == 0
    assert "already installed, unchanged" in again.stdout
    assert fake_tools.argvs() == []
    assert sha256(agent_plist(home)) == before


def test_a_changed_agent_is_booted_out_rewritten_and_started_again(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    plist = agent_plist(home)
    assert install(cli, config_file, "macos").exit_code == 0
    old = sha256(plist)
    fake_tools.clear()
    fake_tools.watch(plist)
    monkeypatch.setenv("MLXD_LOG_LEVEL", "debug")
    result = install(cli, config_file, "macos")
    assert result.exit_code == 0, result.output
    calls = fake_tools.calls()
    assert [c.argv for c in calls] == [
        ["launchctl", "bootout", SERVICE],
        ["launchctl", "bootstrap", GUI, str(plist)],
        ["launchctl", "enable", SERVICE],
        ["launchctl", "kickstart", "-k", SERVICE],
    ]
    new = sha256(plist)
    assert new != old
    # bootout saw the old file, everything after it the new one
    assert [c.watched for c in calls] == [old, new, new, new]
    assert "updated and restarted" in result.stdout


def test_replacing_an_agent_that_was_not_loaded_still_installs_it(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert install(cli, config_file, "macos").exit_code == 0
    fake_tools.respond("launchctl bootout", status=3, stderr="Boot-out failed: 3: No such process\n")
    monkeypatch.setenv("MLXD_LOG_LEVEL", "debug")
    result = install(cli, config_file, "macos")
    assert result.exit_code == 0, result.output
    assert [a[1] for a in fake_tools.argvs()[-4:]] == ["bootout", "bootstrap", "enable", "kickstart"]


@pytest.mark.parametrize(
    ("platform", "failing", "status", "stderr", "hint_words", "ran"),
    [
        (
            "macos", "launchctl bootstrap", 5, "Bootstrap failed: 5: Input/output error",
            ["already be loaded", "mlxd service restart"], ["bootstrap"],
        ),
        (
            "linux", "systemctl daemon-reload", 1, "Failed to connect to bus: No medium found",
            ["loginctl enable-linger"], ["--user"],
        ),
    ],
)
def test_a_failing_tool_shows_its_words_a_hint_and_its_status(
    cli, home: Path, config_file: Path, fake_tools: FakeTools,
    platform: str, failing: str, status: int, stderr: str, hint_words: list[str], ran: list[str],
) -> None:
    fake_tools.respond(failing, status=status, stderr=stderr + "\n")
    result = install(cli, config_file, platform)
    assert result.exit_code == status
    assert stderr in result.stderr.splitlines()
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint:"))
    assert all(word in hint for word in hint_words)
    # Nothing after the failed step ran.
    assert [a[1] for a in fake_tools.argvs()] == ran


def test_after_a_failed_first_install_the_next_install_starts_over(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    fake_tools.respond("launchctl bootstrap", status=5, stderr="Bootstrap failed: 5: Input/output error\n")
    assert install(cli, config_file, "macos").exit_code == 5
    assert not agent_plist(home).exists()
    fake_tools.clear()
    fake_tools.respond("launchctl bootstrap", status=0)
    retry = install(cli, config_file, "macos")
    assert retry.exit_code == 0
    assert [a[1] for a in fake_tools.argvs()] == ["bootstrap", "enable", "kickstart"]


def test_a_failed_replace_puts_the_previous_unit_back(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    assert install(cli, config_file, "linux").exit_code == 0
    before = user_unit(home).read_bytes()
    fake_tools.respond("systemctl restart", status=1, stderr="Job for mlxd.service failed.\n")
    config_file.write_text(service_registry(90))
    result = install(cli, config_file, "linux")
    assert result.exit_code == 1
    assert "Job for mlxd.service failed." in result.stderr
    assert "put back as it was" in result.stderr
    assert user_unit(home).read_bytes() == before


def test_uninstall_boots_out_then_removes_the_plist(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    plist = agent_plist(home)
    assert install(cli, config_file, "macos").exit_code == 0
    fake_tools.clear()
    fake_tools.watch(plist)
    result = cli("uninstall", "--platform", "macos")
    assert result.exit_code == 0, result.output
    calls = fake_tools.calls()
    assert [c.argv for c in calls] == [["launchctl", "bootout", SERVICE]]
    assert calls[0].watched is not None  # still there while launchd let go of it
    assert not plist.exists()


def test_uninstall_of_an_agent_that_is_not_loaded_still_removes_the_file(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    assert install(cli, config_file, "macos").exit_code == 0
    fake_tools.respond("launchctl bootout", status=113, stderr='Could not find service "com.mlxd.daemon"\n')
    result = cli("uninstall", "--platform", "macos")
    assert result.exit_code == 0, result.output
    assert "not loaded" in result.stdout
    assert not agent_plist(home).exists()


def test_uninstall_without_a_plist_still_boots_out_a_stray_job(
    cli, home: Path, fake_tools: FakeTools
) -> None:
    result = cli("uninstall", "--platform", "macos")
    assert result.exit_code == 0
    assert "not installed" in result.stdout
    assert fake_tools.argvs() == [["launchctl", "bootout", SERVICE]]


def test_status_prints_launchctl_output_and_keeps_its_exit_status(
    cli, home: Path, fake_tools: FakeTools
) -> None:
    fake_tools.respond("launchctl print", stdout=f"{SERVICE} = {{\n\tstate = running\n}}\n")
    result = cli("status", "--platform", "macos")
    assert result.exit_code == 0
    assert "state = running" in result.stdout
    assert fake_tools.argvs() == [["launchctl", "print", SERVICE]]

    fake_tools.respond(
        "launchctl print", status=113, stderr=f'Could not find service "{LABEL}" in domain for user gui: {UID}\n'
    )
    missing = cli("status", "--platform", "macos")
    assert missing.exit_code == 113
    assert f'Could not find service "{LABEL}"' in missing.stderr
    assert "hint: the service is not loaded" in missing.stderr


def test_restart_kickstarts_with_kill(cli, home: Path, fake_tools: FakeTools) -> None:
    result = cli("restart", "--platform", "macos")
    assert result.exit_code == 0
    assert fake_tools.argvs() == [["launchctl", "kickstart", "-k", SERVICE]]


@pytest.mark.parametrize("follow", [False, True])
def test_logs_tail_both_log_files(cli, home: Path, fake_tools: FakeTools, follow: bool) -> None:
    fake_tools.respond("tail", stdout="mlxd listening on 127.0.0.1:8080\n")
    args = ["logs", "--platform", "macos", "--lines", "20"] + (["--follow"] if follow else [])
    result = cli(*args)
    assert result.exit_code == 0, result.output
    logs = home / "Library" / "Logs" / "mlxd"
    assert fake_tools.argvs() == [
        ["tail", "-n", "20", *(["-F"] if follow else []), str(logs / f"{LABEL}.out.log"), str(logs / f"{LABEL}.err.log")]
    ]
    if not follow:  # followed output goes straight to the terminal
        assert "mlxd listening" in result.stdout


def test_a_missing_config_is_exit_status_2_and_touches_nothing(
    cli, home: Path, fake_tools: FakeTools
) -> None:
    result = install(cli, home / "nope.yaml", "macos")
    assert result.exit_code == 2
    assert "config file does not exist" in result.stderr
    assert str(home / "nope.yaml") in result.stderr
    assert fake_tools.argvs() == [] and all_files(home) == []


def test_an_unusable_label_is_exit_status_2(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    result = install(cli, config_file, "macos", "--label", "../evil")
    assert result.exit_code == 2
    assert "--label" in result.stderr
    assert fake_tools.argvs() == []


def test_a_bad_grace_in_the_config_is_exit_status_2(cli, home: Path, fake_tools: FakeTools) -> None:
    config = home / "models.yaml"
    config.write_text(service_registry("soon"))
    result = install(cli, config, "linux")
    assert result.exit_code == 2
    assert "server.shutdown_grace_seconds" in result.stderr


@pytest.mark.parametrize("platform", ["macos", "linux"])
def test_a_registry_the_daemon_would_refuse_is_not_installed(
    cli, home: Path, fake_tools: FakeTools, platform: str
) -> None:
    # Installed, it would exit 2 at every start; the install says why instead.
    config = home / "models.yaml"
    config.write_text(service_registry(5) + "    max_concurrency: lots\n")
    result = install(cli, config, platform)
    assert result.exit_code == 2
    assert f"{config}:6: models[0].max_concurrency" in result.stderr
    assert fake_tools.argvs() == []
    assert not user_unit(home).exists() and not list(home.glob("Library/LaunchAgents/*"))


def test_a_file_that_cannot_be_written_stops_before_launchctl(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    (home / "Library").write_text("not a folder")
    result = install(cli, config_file, "macos")
    assert result.exit_code == 1
    assert f"{home / 'Library'}" in result.stderr
    assert "hint:" in result.stderr
    assert fake_tools.argvs() == []


def test_launchctl_missing_from_path_is_explained(
    cli, home: Path, fake_tools: FakeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_tools.bin_dir / "launchctl").unlink()
    monkeypatch.setenv("PATH", str(fake_tools.bin_dir))
    result = cli("restart", "--platform", "macos")
    assert result.exit_code == 127
    assert "not on PATH" in result.stderr


# --- Linux: systemd user unit -----------------------------------------------------------

SYSTEMCTL = ["systemctl", "--user"]


def test_linux_install_reloads_and_enables_now(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    result = install(cli, config_file, "linux")
    assert result.exit_code == 0, result.output
    assert fake_tools.argvs() == [
        [*SYSTEMCTL, "daemon-reload"],
        [*SYSTEMCTL, "enable", "--now", "mlxd.service"],
    ]
    assert user_unit(home).is_file()


def test_linux_reinstall_unchanged_runs_nothing(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    assert install(cli, config_file, "linux").exit_code == 0
    fake_tools.clear()
    result = install(cli, config_file, "linux")
    assert result.exit_code == 0
    assert "already installed, unchanged" in result.stdout
    assert fake_tools.argvs() == []


def test_linux_changed_unit_is_reloaded_and_restarted(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    assert install(cli, config_file, "linux").exit_code == 0
    unit = user_unit(home)
    old = sha256(unit)
    fake_tools.clear()
    fake_tools.watch(unit)
    config_file.write_text(service_registry(90))
    result = install(cli, config_file, "linux")
    assert result.exit_code == 0, result.output
    calls = fake_tools.calls()
    assert [c.argv for c in calls] == [
        [*SYSTEMCTL, "daemon-reload"],
        [*SYSTEMCTL, "enable", "mlxd.service"],
        [*SYSTEMCTL, "restart", "mlxd.service"],
    ]
    assert all(c.watched == sha256(unit) != old for c in calls)
    assert "TimeoutStopSec=120" in unit.read_text()


def test_linux_uninstall_disables_removes_and_reloads(
    cli, home: Path, config_file: Path, fake_tools: FakeTools
) -> None:
    assert install(cli, config_file, "linux").exit_code == 0
    fake_tools.clear()
    fake_tools.watch(user_unit(home))
    result = cli("uninstall", "--platform", "linux")
    assert result.exit_code == 0, result.output
    calls = fake_tools.calls()
    assert [c.argv for c in calls] == [
        [*SYSTEMCTL, "disable", "--now", "mlxd.service"],
        [*SYSTEMCTL, "daemon-reload"],
    ]
    assert calls[0].watched is not None and calls[1].watched is None
    assert not user_unit(home).exists()


def test_linux_uninstall_when_not_installed_runs_nothing(cli, home: Path, fake_tools: FakeTools) -> None:
    result = cli("uninstall", "--platform", "linux")
    assert result.exit_code == 0
    assert "not installed" in result.stdout
    assert fake_tools.argvs() == []


def test_linux_status_restart_and_logs(cli, home: Path, fake_tools: FakeTools) -> None:
    fake_tools.respond("systemctl status", status=3, stdout="○ mlxd.service - mlxd\n     Active: inactive (dead)\n")
    status = cli("status", "--platform", "linux")
    assert status.exit_code == 3  # systemctl's "not running", passed through
    assert "Active: inactive (dead)" in status.stdout
    assert "hint: the service is not running" in status.stderr
    assert cli("restart", "--platform", "linux").exit_code == 0
    assert cli("logs", "--platform", "linux", "-f").exit_code == 0
    assert fake_tools.argvs() == [
        [*SYSTEMCTL, "status", "--no-pager", "mlxd.service"],
        [*SYSTEMCTL, "restart", "mlxd.service"],
        ["journalctl", "--user", "-u", "mlxd.service", "-n", "100", "--no-pager", "-f"],
    ]


def test_a_custom_label_names_the_unit(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    result = install(cli, config_file, "linux", "--label", "com.mlxd.coder")
    assert result.exit_code == 0
    assert (home / ".config" / "systemd" / "user" / "com.mlxd.coder.service").is_file()
    assert fake_tools.argvs()[-1] == [*SYSTEMCTL, "enable", "--now", "com.mlxd.coder.service"]


def _state_dirs(home: Path, platform: str, label: str) -> list[str]:
    """The MLXD_STATE_DIR the installed service runs with (none: the daemon's default)."""
    if platform == "macos":
        plist = plistlib.loads((home / "Library" / "LaunchAgents" / f"{label}.plist").read_bytes())
        value = plist["EnvironmentVariables"].get("MLXD_STATE_DIR")
        return [value] if value else []
    name = "mlxd.service" if label == LABEL else f"{label}.service"
    unit = (home / ".config" / "systemd" / "user" / name).read_text()
    return [line.split("=", 2)[2].rstrip('"') for line in unit.splitlines()
            if line.startswith('Environment="MLXD_STATE_DIR=')]


@pytest.mark.parametrize("platform", ["macos", "linux"])
def test_a_second_instance_gets_a_state_dir_of_its_own(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs' "Several instances": a second config under another --label. Both
    ran on the daemon's default state dir, whose lock admits one daemon: the
    second exited 2 at every start (launchd restarting it every 10 s)."""
    assert install(cli, config_file, platform).exit_code == 0
    assert install(cli, config_file, platform, "--label", "com.mlxd.coder").exit_code == 0
    assert _state_dirs(home, platform, LABEL) == []
    [coder] = _state_dirs(home, platform, "com.mlxd.coder")
    default = home / ("Library/Application Support/mlxd" if platform == "macos" else ".local/state/mlxd")
    assert Path(coder) == default / "com.mlxd.coder"

    # One set at install is kept.
    monkeypatch.setenv("MLXD_STATE_DIR", str(home / "mine"))
    assert install(cli, config_file, platform, "--label", "com.mlxd.coder").exit_code == 0
    assert _state_dirs(home, platform, "com.mlxd.coder") == [str(home / "mine")]


# --- dry run ----------------------------------------------------------------------------

DRY_RUN_CASES = {
    ("macos", "install"): [f"launchctl bootstrap {GUI} ", f"launchctl enable {SERVICE}", f"launchctl kickstart -k {SERVICE}"],
    ("macos", "uninstall"): [f"launchctl bootout {SERVICE}"],
    ("macos", "status"): [f"launchctl print {SERVICE}"],
    ("macos", "restart"): [f"launchctl kickstart -k {SERVICE}"],
    ("macos", "logs"): ["tail -n 100 -F "],
    ("linux", "install"): ["systemctl --user daemon-reload", "systemctl --user enable --now mlxd.service"],
    ("linux", "uninstall"): [],
    ("linux", "status"): ["systemctl --user status --no-pager mlxd.service"],
    ("linux", "restart"): ["systemctl --user restart mlxd.service"],
    ("linux", "logs"): ["journalctl --user -u mlxd.service -n 100 --no-pager -f"],
}


@pytest.mark.parametrize(("platform", "command"), list(DRY_RUN_CASES))
def test_dry_run_prints_the_commands_and_writes_and_runs_nothing(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, platform: str, command: str
) -> None:
    before = all_files(home)
    args = [command, "--dry-run", "--platform", platform]
    if command == "install":
        args += ["--config", str(config_file)]
    if command == "logs":
        args.append("--follow")
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert all_files(home) == before
    assert fake_tools.argvs() == []
    ran = [line.removeprefix("Would run: ") for line in result.stdout.splitlines() if line.startswith("Would run: ")]
    expected = DRY_RUN_CASES[(platform, command)]
    assert len(ran) == len(expected)
    assert all(line.startswith(prefix) for line, prefix in zip(ran, expected))


def test_dry_run_install_prints_the_file_it_would_write(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    result = cli("install", "--dry-run", "--platform", "macos", "--config", str(config_file))
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Would write ")) + 1
    end = lines.index(f"(end of {LABEL}.plist)")
    printed = plistlib.loads("\n".join(lines[start:end]).encode())
    assert printed["ProgramArguments"][-1] == str(config_file)


def test_dry_run_of_a_changed_agent_shows_bootout_before_the_write(
    cli, home: Path, config_file: Path, fake_tools: FakeTools, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert install(cli, config_file, "macos").exit_code == 0
    before = sha256(agent_plist(home))
    fake_tools.clear()
    monkeypatch.setenv("MLXD_PORT", "9000")
    result = install(cli, config_file, "macos", "--dry-run")
    steps = [line.split(" ", 2)[:2] for line in result.stdout.splitlines() if line.startswith("Would ")]
    assert [s[1] for s in steps if s[1] in ("run:", "write")] == ["run:", "write", "run:", "run:", "run:"]
    assert sha256(agent_plist(home)) == before and fake_tools.argvs() == []


def test_system_dry_run_targets_the_system_domain(cli, home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    result = install(cli, config_file, "macos", "--system", "--dry-run")
    assert result.exit_code == 0
    assert "Would write /Library/LaunchDaemons/com.mlxd.daemon.plist (mode 644):" in result.stdout
    assert "Would run: launchctl bootstrap system /Library/LaunchDaemons/com.mlxd.daemon.plist" in result.stdout
    assert "Would run: launchctl kickstart -k system/com.mlxd.daemon" in result.stdout


# --- as a real process ------------------------------------------------------------------


def test_python_dash_m_runs_the_service_commands(home: Path, config_file: Path, fake_tools: FakeTools) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mlxd.service", "install", "--config", str(config_file), "--platform", "linux"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert fake_tools.argvs()[-1] == [*SYSTEMCTL, "enable", "--now", "mlxd.service"]
    failed = subprocess.run(
        [sys.executable, "-m", "mlxd.service", "install", "--config", str(home / "missing.yaml")],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=60,
    )
    assert failed.returncode == 2
    assert "config file does not exist" in failed.stderr
