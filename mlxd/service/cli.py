"""``mlxd service ...``: install and drive mlxd as a launchd or systemd service.

The main CLI mounts ``service_app``; ``python -m mlxd.service`` runs it alone.
Every command accepts ``--dry-run``: it prints the file it would write and the
exact commands it would run, and touches nothing.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

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


@dataclass(frozen=True)
class _Chosen:
    """What the options every service command takes picked: the service
    manager for the platform and label, and whether to only print."""

    manager: ServiceManager
    label: str
    dry_run: bool

    def finish(self, plan: Plan) -> None:
        _finish(plan, self.dry_run)


def _common_parameters() -> list[inspect.Parameter]:
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("label", keyword, annotation=LabelOption, default=DEFAULT_LABEL),
        inspect.Parameter("system", keyword, annotation=SystemOption, default=False),
        inspect.Parameter("dry_run", keyword, annotation=DryRunOption, default=False),
        inspect.Parameter("platform", keyword, annotation=PlatformOption, default=None),
    ]


def _service_command(
    name: str | None = None, help_text: str | None = None
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Registers ``func(chosen, **its own options)`` as a command that also
    takes --label, --system, --dry-run and the hidden --platform, written once."""

    def register(func: Callable[..., None]) -> Callable[..., None]:
        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]

        def command(**options: Any) -> None:
            label, system, dry_run = options.pop("label"), options.pop("system"), options.pop("dry_run")
            func(_Chosen(_manager(label, system, options.pop("platform")), label, dry_run), **options)

        parameters = [*own, *_common_parameters()]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__doc__ = func.__doc__
        service_app.command(name or func.__name__, help=help_text)(command)
        return func

    return register


@_service_command()
def install(
    chosen: _Chosen,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            help="The models.yaml the service runs with (stored as an absolute path; default: "
            "MLXD_CONFIG, then ~/.config/mlxd/models.yaml, on macOS ~/Library/Application Support/mlxd/models.yaml).",
        ),
    ] = None,
) -> None:
    """Install the service and start it; again with the same settings changes nothing."""
    manager = chosen.manager
    if config is None:
        configured = os.environ.get("MLXD_CONFIG")
        macos = isinstance(manager, LaunchdManager)
        config = Path(configured) if configured else default_config_path(os.environ, macos=macos)
    try:
        spec = build_service_spec(
            target=manager.target, config=config, environ=os.environ, python=sys.executable,
            allow_missing=chosen.dry_run, state_base=manager.state_base,
        )
        plan = plan_install(manager, spec)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:  # the installed file exists but cannot be read
        raise _fail(f"{exc.strerror or exc}: {exc.filename}", code=1) from None
    chosen.finish(plan)
    if not spec.config_path.exists():
        typer.echo(
            f"note: {spec.config_path} does not exist yet and install will refuse to run without it; "
            f"{create_config_hint(spec.config_path)}"
        )


def _add_plain_command(name: str, help_text: str, plan_for: Callable[[ServiceManager, str], Plan]) -> None:
    """uninstall, status and restart take only the common options and differ only in their plan."""

    def command(chosen: _Chosen) -> None:
        chosen.finish(plan_for(chosen.manager, chosen.label))

    _service_command(name, help_text)(command)


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


@_service_command()
def logs(
    chosen: _Chosen,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="How many past lines to show.")] = 100,
) -> None:
    """Print the service's logs (the two log files on macOS, the journal on Linux)."""
    command = chosen.manager.logs(follow=follow, lines=lines)
    chosen.finish(Plan((command,), summary="", interactive=follow))


def main() -> None:
    service_app(prog_name="mlxd service")


if __name__ == "__main__":
    main()
