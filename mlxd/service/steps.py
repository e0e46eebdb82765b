"""A service action as a list of steps, decided before anything is touched.

Deciding and doing are separate so that ``--dry-run`` prints exactly what a
real run would do: the same ``Plan`` is either described or carried out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Union

if TYPE_CHECKING:
    from mlxd.service.spec import ServiceSpec, ServiceTarget


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    # Exit codes meaning "the service was not loaded": fine when stopping it.
    not_loaded_codes: frozenset[int] = frozenset()

    def shell(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class MakeDirectory:
    path: Path
    # Hand the folder to the user a system service runs as (only when root).
    owner: str | None = None


@dataclass(frozen=True)
class WriteFile:
    path: Path
    content: bytes
    mode: int = 0o600
    # Who must be able to read it (a system service's user; only when root).
    owner: str | None = None
    # API keys: a dry run says the file is written, never what it holds.
    secret: bool = False


@dataclass(frozen=True)
class RemoveFile:
    path: Path


Step = Union[Command, MakeDirectory, WriteFile, RemoveFile]


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    # Said before the steps run (or instead of them when there are none).
    summary: str
    # Shown after a successful run.
    done: str = ""
    # Inherit the terminal (``logs --follow``) instead of capturing output.
    interactive: bool = False
    # File steps that put the unit file back as it was when a command fails
    # after it was written, so the file always means "last install that
    # worked" and the next install does not wrongly say "unchanged".
    undo_on_failure: tuple[RemoveFile | WriteFile, ...] = ()


class ServiceManager(Protocol):
    """One platform's way to install and drive the service (launchd, systemd)."""

    @property
    def target(self) -> ServiceTarget: ...

    @property
    def unit_path(self) -> Path: ...

    @property
    def file_mode(self) -> int: ...

    @property
    def secrets_path(self) -> Path: ...

    @property
    def state_base(self) -> Path | None: ...

    def render(self, spec: ServiceSpec) -> bytes: ...

    def secret_file(self, spec: ServiceSpec) -> WriteFile | None: ...

    def directories(self, spec: ServiceSpec) -> tuple[MakeDirectory, ...]: ...

    def start_new(self) -> tuple[Command, ...]: ...

    def stop_before_replace(self) -> tuple[Command, ...]: ...

    def start_replaced(self) -> tuple[Command, ...]: ...

    def uninstall_steps(self, installed: bool) -> tuple[Step, ...]: ...

    def status(self) -> Command: ...

    def restart(self) -> Command: ...

    def logs(self, *, follow: bool, lines: int) -> Command: ...


def read_existing(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        # Not there (or a parent is not a folder): writing it will say why.
        return None


def _secret_steps(
    manager: ServiceManager, spec: ServiceSpec, existing: bytes | None
) -> tuple[tuple[Step, ...], tuple[RemoveFile | WriteFile, ...]]:
    """Write the secrets file (or remove one no longer wanted), and its undo."""
    wanted = manager.secret_file(spec)
    path = manager.secrets_path
    if wanted is not None and wanted.content == existing:
        return (), ()
    undo: tuple[RemoveFile | WriteFile, ...] = (
        (RemoveFile(path),) if existing is None
        else (WriteFile(path, existing, 0o600, owner=wanted.owner if wanted else None, secret=True),)
    )
    if wanted is not None:
        return (MakeDirectory(path.parent, owner=wanted.owner), wanted), undo
    if existing is not None:
        return (RemoveFile(path),), undo
    return (), ()


def plan_install(manager: ServiceManager, spec: ServiceSpec) -> Plan:
    """Idempotent: the same content twice does nothing; new content replaces and restarts."""
    label = spec.target.label
    rendered = manager.render(spec)
    path = manager.unit_path
    existing = read_existing(path)
    secret_steps, secret_undo = _secret_steps(manager, spec, read_existing(manager.secrets_path))
    if existing == rendered and not secret_steps:
        return Plan(
            steps=(),
            summary=f"{label} already installed, unchanged: {path}",
            done="Nothing to do. `mlxd service restart` restarts it.",
        )
    write = WriteFile(path, rendered, manager.file_mode)
    if existing is None:
        steps: tuple[Step, ...] = (*manager.directories(spec), *secret_steps, write, *manager.start_new())
        return Plan(
            steps,
            summary=f"Installing {label}: {path}",
            done=f"{label} installed and started.",
            undo_on_failure=(RemoveFile(path), *secret_undo),
        )
    steps = (
        *manager.stop_before_replace(),
        *manager.directories(spec),
        *secret_steps,
        write,
        *manager.start_replaced(),
    )
    return Plan(
        steps,
        summary=f"Replacing {label} (its file changed): {path}",
        done=f"{label} updated and restarted.",
        undo_on_failure=(WriteFile(path, existing, manager.file_mode), *secret_undo),
    )


def plan_uninstall(manager: ServiceManager, label: str) -> Plan:
    installed = manager.unit_path.exists()
    steps = manager.uninstall_steps(installed)
    if manager.secrets_path.exists():
        steps = (*steps, RemoveFile(manager.secrets_path))
    if installed:
        return Plan(steps, summary=f"Removing {label}: {manager.unit_path}", done=f"{label} removed.")
    return Plan(
        steps,
        summary=f"{label} is not installed (no {manager.unit_path})",
        done="Nothing left to remove.",
    )


def describe(plan: Plan) -> list[str]:
    """The dry-run text: the files as they would be written and the exact commands."""
    lines = [plan.summary]
    for step in plan.steps:
        if isinstance(step, MakeDirectory):
            lines.append(f"Would create directory {step.path}")
        elif isinstance(step, WriteFile) and step.secret:
            lines.append(f"Would write {step.path} (mode {step.mode:o}): the API keys, not shown here")
        elif isinstance(step, WriteFile):
            lines.append(f"Would write {step.path} (mode {step.mode:o}):")
            lines.extend(step.content.decode("utf-8").rstrip("\n").splitlines())
            lines.append(f"(end of {step.path.name})")
        elif isinstance(step, RemoveFile):
            lines.append(f"Would remove {step.path}")
        else:
            note = "  # not being loaded is fine" if step.not_loaded_codes else ""
            lines.append(f"Would run: {step.shell()}{note}")
    if not plan.steps:
        lines.append("Would run nothing.")
    for undo in plan.undo_on_failure:
        verb = "remove" if isinstance(undo, RemoveFile) else "restore the previous"
        lines.append(f"If a command fails after the write: would {verb} {undo.path}")
    return lines

