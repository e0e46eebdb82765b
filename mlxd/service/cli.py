"""``mlxd service ...``: install and drive mlxd as a launchd or systemd service.

The main CLI mounts ``service_app``; ``python -m mlxd.service`` runs it alone.
Every command accepts ``--dry-run``: it prints the file it would write and the
exact commands it would run, and touches nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from mlxd.settings import create_config_hint, default_config_path
from mlxd.errors import ConfigError
from mlxd.service.execute import SubprocessRunner, execute
from mlxd.service.launchd import LaunchdManager
from mlxd.service.steps import Plan, ServiceManager, describe, plan_install, plan_uninstall
from mlxd.service.spec import DEFAULT_LABEL, build_service_spec, build_target
from mlxd.service.systemd import SystemdManager

CONFIG_ERROR_EXIT = 2


class Platform(str, Enum):
    macos = "macos"
    linux = "linux"


LabelOption = Annotated[
    str, typer.Option("--label", help="launchd label; on Linux the unit is mlxd.service for the default, else <label>.service.")
]
SystemOption = Annotated[
    bool,
    typer.Option(
        "--system",
        help="System-wide: /Library/LaunchDaemons (macOS) or /etc/systemd/system (Linux). Needs sudo.",
    ),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print the file and the exact commands; write and run nothing.")
]
# Hidden: lets tests and docs render the other platform's files.
PlatformOption = Annotated[
    Optional[Platform], typer.Option("--platform", hidden=True, case_sensitive=False)
]

service_app = typer.Typer(
    name="service",
    help="Run mlxd as a service: a launchd agent on macOS, a systemd user unit on Linux.",
    no_args_is_help=True,
    add_completion=False,
)


def detect_platform() -> Platform | None:
    if sys.platform == "darwin":
        return Platform.macos
    if sys.platform.startswith("linux"):
        return Platform.linux
    return None


def _say(text: str, to_stderr: bool) -> None:
    typer.echo(text, err=to_stderr)


def _fail(message: str, code: int = CONFIG_ERROR_EXIT) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _manager(label: str, system: bool, platform: Platform | None) -> ServiceManager:
    chosen = platform or detect_platform()
    if chosen is None:
        raise _fail(f"services are supported on macOS and Linux, not {sys.platform}")
    try:
        target = build_target(label=label, system=system, environ=os.environ)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    return LaunchdManager(target) if chosen is Platform.macos else SystemdManager(target)


def _finish(plan: Plan, dry_run: bool) -> None:
    if dry_run:
        for line in describe(plan):
            typer.echo(line)
        return
    code = execute(plan, SubprocessRunner(), _say)
    if code != 0:
        # A tool killed by a signal reports a negative code; keep it non-zero.
        raise typer.Exit(code if 0 < code < 256 else 1)


@service_app.command()
def install(
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            help="The models.yaml the service runs with (stored as an absolute path; default: "
            "MLXD_CONFIG, then ~/.config/mlxd/models.yaml, on macOS ~/Library/Application Support/mlxd/models.yaml).",
        ),
    ] = None,
    label: LabelOption = DEFAULT_LABEL,
    system: SystemOption = False,
    dry_run: DryRunOption = False,
    platform: PlatformOption = None,
) -> None:
    """Install the service and start it; again with the same settings changes nothing."""
    manager = _manager(label, system, platform)
    if config is None:
        configured = os.environ.get("MLXD_CONFIG")
        macos = isinstance(manager, LaunchdManager)
        config = Path(configured) if configured else default_config_path(os.environ, macos=macos)
    try:
        spec = build_service_spec(
            target=manager.target, config=config, environ=os.environ, python=sys.executable,
            allow_missing=dry_run,
        )
        plan = plan_install(manager, spec)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:  # the installed file exists but cannot be read
        raise _fail(f"{exc.strerror or exc}: {exc.filename}", code=1) from None
    _finish(plan, dry_run)
    if not spec.config_path.exists():
        typer.echo(
            f"note: {spec.config_path} does not exist yet and install will refuse to run without it; "
            f"{create_config_hint(spec.config_path)}"
        )


def _add_plain_command(name: str, help_text: str, plan_for: Callable[[ServiceManager, str], Plan]) -> None:
    """uninstall, status and restart take the same options and differ only in their plan."""

    def command(
        label: LabelOption = DEFAULT_LABEL,
        system: SystemOption = False,
        dry_run: DryRunOption = False,
        platform: PlatformOption = None,
    ) -> None:
        _finish(plan_for(_manager(label, system, platform), label), dry_run)

    service_app.command(name, help=help_text)(command)


_add_plain_command("uninstall", "Stop the service and remove its file.", plan_uninstall)
_add_plain_command(
    "status",
    "Show what launchd/systemd know about the service (exit status is theirs).",
    lambda manager, _label: Plan((manager.status(),), summary=""),
)
_add_plain_command(
    "restart",
    "Restart the service: SIGTERM (it drains), then start again.",
    lambda manager, label: Plan((manager.restart(),), summary=f"Restarting {label}", done="Restarted."),
)


@service_app.command()
def logs(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="How many past lines to show.")] = 100,
    label: LabelOption = DEFAULT_LABEL,
    system: SystemOption = False,
    dry_run: DryRunOption = False,
    platform: PlatformOption = None,
) -> None:
    """Print the service's logs (the two log files on macOS, the journal on Linux)."""
    manager = _manager(label, system, platform)
    command = manager.logs(follow=follow, lines=lines)
    _finish(Plan((command,), summary="", interactive=follow), dry_run)


def main() -> None:
    service_app(prog_name="mlxd service")


if __name__ == "__main__":
    main()
