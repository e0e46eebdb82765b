"""The launchd plist: every key with the right value, rendered from the one template."""

from __future__ import annotations

import os
import plistlib
import sys
from pathlib import Path

import pytest

from mlxd.service.launchd import ABSENT, TEMPLATE_NAME, LaunchdManager, fill_template, template_text
from mlxd.service.spec import build_service_spec, build_target
from support.service_registry import service_registry

REPO = Path(__file__).resolve().parents[2]
ROOT_TEMPLATE = REPO / "launchd" / TEMPLATE_NAME
PACKAGED_TEMPLATE = REPO / "mlxd" / "service" / "templates" / TEMPLATE_NAME


def render(home: Path, config: Path, environ: dict[str, str], *, system: bool = False) -> dict:
    environ = {"HOME": str(home), **environ}
    target = build_target(label="com.mlxd.daemon", system=system, environ=environ)
    spec = build_service_spec(target=target, config=config, environ=environ, python=sys.executable)
    return plistlib.loads(LaunchdManager(target).render(spec))


def test_user_agent_plist_has_every_key_with_its_value(home: Path, config_file: Path) -> None:
    environ = {
        "PATH": "/opt/homebrew/bin:/usr/bin:/bin",
        "MLXD_API_KEYS": "sk-one,sk-two",
        "MLXD_LOG_LEVEL": "debug",
        "OPENAI_API_KEY": "not-ours",
    }
    plist = render(home, config_file, environ)
    logs = home / "Library" / "Logs" / "mlxd"
    assert plist == {
        "Label": "com.mlxd.daemon",
        "ProgramArguments": [sys.executable, "-m", "mlxd", "serve", "--config", str(config_file)],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        # config says shutdown_grace_seconds: 45 -> SIGKILL only 30 s after the drain could end
        "ExitTimeOut": 75,
        "ProcessType": "Interactive",
        "StandardOutPath": str(logs / "com.mlxd.daemon.out.log"),
        "StandardErrorPath": str(logs / "com.mlxd.daemon.err.log"),
        # The keys are in an owner-only file the daemon reads, never in the plist.
        "EnvironmentVariables": {
            "MLXD_API_KEYS_FILE": str(home / "Library" / "Application Support" / "mlxd" / "com.mlxd.daemon.api-keys"),
            "MLXD_LOG_LEVEL": "debug",
            "PATH": "/opt/homebrew/bin:/usr/bin:/bin",
        },
        "WorkingDirectory": str(config_file.parent),
    }


def test_the_python_is_the_venv_entry_point_not_its_symlink_target(home: Path, config_file: Path) -> None:
    # Resolving would escape the venv and lose its packages.
    plist = render(home, config_file, {})
    assert plist["ProgramArguments"][0] == sys.executable
    assert os.path.isabs(plist["ProgramArguments"][-1])


def test_exit_timeout_uses_the_default_grace_when_the_config_has_none(home: Path) -> None:
    config = home / "models.yaml"
    config.write_text(service_registry())
    assert render(home, config, {})["ExitTimeOut"] == 30 + 30


def test_fractional_grace_rounds_up_so_the_kill_never_comes_early(home: Path) -> None:
    config = home / "models.yaml"
    config.write_text(service_registry(12.2))
    assert render(home, config, {})["ExitTimeOut"] == 13 + 30


def test_paths_with_xml_and_shell_characters_survive(home: Path) -> None:
    folder = home / "models & <more> \"quoted\" 100%"
    folder.mkdir()
    config = folder / "my models.yaml"
    config.write_text(service_registry())
    plist = render(home, config, {"MLXD_NOTE": "a <b> & 'c'"})
    assert plist["ProgramArguments"][-1] == str(config)
    assert plist["WorkingDirectory"] == str(folder)
    assert plist["EnvironmentVariables"]["MLXD_NOTE"] == "a <b> & 'c'"


def test_system_daemon_runs_as_the_sudo_user_with_system_paths(home: Path, config_file: Path) -> None:
    plist = render(home, config_file, {"SUDO_USER": "alice"}, system=True)
    assert plist["UserName"] == "alice"
    assert plist["StandardOutPath"] == "/Library/Logs/mlxd/com.mlxd.daemon.out.log"
    target = build_target(label="com.mlxd.daemon", system=True, environ={"HOME": str(home)})
    assert LaunchdManager(target).unit_path == Path("/Library/LaunchDaemons/com.mlxd.daemon.plist")


def test_packaged_template_is_a_byte_identical_copy_of_the_root_one() -> None:
    # launchd/ is the file people read and edit; the package ships a copy.
    assert PACKAGED_TEMPLATE.read_bytes() == ROOT_TEMPLATE.read_bytes(), (
        f"cp {ROOT_TEMPLATE.relative_to(REPO)} {PACKAGED_TEMPLATE.relative_to(REPO)}"
    )
    assert template_text() == ROOT_TEMPLATE.read_bytes()


@pytest.mark.parametrize("system", [False, True])
def test_rendered_plist_has_exactly_the_template_keys(home: Path, config_file: Path, system: bool) -> None:
    template_keys = set(plistlib.loads(ROOT_TEMPLATE.read_bytes()))
    rendered_keys = set(render(home, config_file, {"SUDO_USER": "alice"}, system=system))
    # UserName is the one key a per-user agent leaves out.
    expected = template_keys if system else template_keys - {"UserName"}
    assert rendered_keys == expected


def test_template_placeholders_must_all_be_filled_and_all_values_used() -> None:
    template = plistlib.dumps({"Label": "@LABEL@", "Extra": "@EXTRA@"})
    with pytest.raises(KeyError, match="@EXTRA@"):
        fill_template(template, {"LABEL": "x"})
    with pytest.raises(KeyError, match="UNUSED"):
        fill_template(template, {"LABEL": "x", "EXTRA": 1, "UNUSED": 2})
    assert fill_template(template, {"LABEL": "x", "EXTRA": ABSENT}) == {"Label": "x"}
