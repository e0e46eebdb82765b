"""Carrying out a ``Plan``: files first-hand, commands through a runner.

Stops at the first failure and reports it as the tool said it, plus a hint;
the exit status is the tool's own (never 0 after a failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mlxd.service.hints import hint_for
from mlxd.service.steps import Command, MakeDirectory, Plan, RemoveFile, WriteFile

# Printer(text, to_stderr)
Printer = Callable[[str, bool], None]


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    def capture(self, argv: Sequence[str]) -> CommandResult: ...

    def attach(self, argv: Sequence[str]) -> int: ...


class SubprocessRunner:
    """Runs the real tools found on PATH (tests put recording stand-ins there)."""

    def capture(self, argv: Sequence[str]) -> CommandResult:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return CommandResult(127, "", f"{argv[0]}: command not found\n")
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def attach(self, argv: Sequence[str]) -> int:
        try:
            return subprocess.run(list(argv), check=False).returncode
        except FileNotFoundError:
            return 127
        except KeyboardInterrupt:
            # Ctrl-C is how one leaves `logs --follow`; not an error.
            return 0


def write_atomically(path: Path, content: bytes, mode: int) -> None:
    """launchd/systemd must never read a half-written file."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _file_step(step: MakeDirectory | WriteFile | RemoveFile, say: Printer) -> None:
    if isinstance(step, MakeDirectory):
        step.path.mkdir(parents=True, exist_ok=True)
        if step.owner and os.geteuid() == 0:
            shutil.chown(step.path, user=step.owner)
    elif isinstance(step, WriteFile):
        write_atomically(step.path, step.content, step.mode)
        if step.owner and os.geteuid() == 0:
            shutil.chown(step.path, user=step.owner)
        say(f"Wrote {step.path}", False)
    else:
        step.path.unlink(missing_ok=True)
        say(f"Removed {step.path}", False)


def _run_command(
    step: Command, runner: CommandRunner, interactive: bool, say: Printer
) -> CommandResult:
    """Shows the tool's output verbatim; returns what the hint needs."""
    say(f"$ {step.shell()}", False)
    if interactive:
        code = runner.attach(step.argv)
        missing = f"{step.argv[0]}: command not found" if code == 127 else ""
        if missing:
            say(missing, True)
        return CommandResult(code, "", missing)
    result = runner.capture(step.argv)
    if result.stdout:
        say(result.stdout.rstrip("\n"), False)
    if result.returncode != 0 and result.returncode in step.not_loaded_codes:
        say("(it was not loaded; continuing)", False)
        return CommandResult(0, result.stdout, result.stderr)
    if result.stderr:
        say(result.stderr.rstrip("\n"), True)
    return result


def execute(plan: Plan, runner: CommandRunner, say: Printer) -> int:
    if plan.summary:
        say(plan.summary, False)
    wrote = False
    for step in plan.steps:
        if isinstance(step, Command):
            result = _run_command(step, runner, plan.interactive, say)
            if result.returncode != 0:
                code = result.returncode
                say(f"error: `{step.shell()}` failed with exit status {code}", True)
                say(f"hint: {hint_for(step.argv, code, result.stderr)}", True)
                if wrote:
                    _undo(plan, say)
                return code
            continue
        wrote = wrote or isinstance(step, WriteFile)
        try:
            _file_step(step, say)
        except OSError as exc:
            say(f"error: {exc.strerror or exc}: {exc.filename or step.path}", True)
            if isinstance(exc, PermissionError):
                say("hint: a system-wide service (--system) must be installed with sudo", True)
            else:
                say("hint: every folder on that path must be a folder you can write to", True)
            return 1
    if plan.done:
        say(plan.done, False)
    return 0



def _undo(plan: Plan, say: Printer) -> None:
    for step in plan.undo_on_failure:
        try:
            _file_step(step, lambda _text, _err: None)
        except OSError as exc:
            say(f"could not put back {step.path}: {exc.strerror or exc}", True)
            continue
        state = "removed" if isinstance(step, RemoveFile) else "put back as it was"
        say(f"{step.path} {state}, so the next install starts over.", True)
