"""Linux: a systemd user unit (``systemctl --user``), or a system unit with ``--system``."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlxd.service.steps import Command, MakeDirectory, RemoveFile, Step, WriteFile
from mlxd.service.spec import DEFAULT_LABEL, RESTART_DELAY_SECONDS, ServiceSpec, ServiceTarget

# Characters an ExecStart= word may hold without quotes. '%' and '$' are
# absent: systemd expands specifiers and variables even inside quotes.
_BARE_WORD = re.compile(r"^[A-Za-z0-9_@+=:,./-]+$")


def unit_name(label: str) -> str:
    """``mlxd.service`` for the default label, else ``<label>.service``."""
    return f"{'mlxd' if label == DEFAULT_LABEL else label}.service"


def _escape_specifiers(text: str) -> str:
    return text.replace("%", "%%")


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{_escape_specifiers(escaped)}"'


def exec_word(arg: str) -> str:
    """One ExecStart= argument, surviving systemd's quoting, specifiers and $VARS."""
    if _BARE_WORD.match(arg):
        return arg
    return _quoted(arg).replace("$", "$$")


def environment_line(name: str, value: str) -> str:
    # Environment= expands specifiers but not $VARS.
    return f"Environment={_quoted(f'{name}={value}')}"


def environment_file_line(name: str, value: str) -> str:
    """One assignment of an EnvironmentFile=. Single quotes keep everything
    literal there; a value holding one gets double quotes, where backslash,
    the quote, '$' and '`' are escaped."""
    if "'" not in value and "\n" not in value:
        return f"{name}='{value}'\n"
    escaped = "".join("\\" + ch if ch in '\\"$`' else ch for ch in value).replace("\n", "\\n")
    return f'{name}="{escaped}"\n'


def render_unit(spec: ServiceSpec, secrets_path: Path | None = None) -> str:
    target = spec.target
    service: list[str] = [
        "Type=simple",
        "ExecStart=" + " ".join(exec_word(a) for a in spec.serve_argv),
        # Restart after a crash, not after a clean stop (no crash loop on exit 0).
        "Restart=on-failure",
        f"RestartSec={RESTART_DELAY_SECONDS}",
        # Exit 2 is a configuration error (a registry typo): restarting cannot
        # fix it, and restarted every 10 s it only fills the journal.
        "RestartPreventExitStatus=2",
        # SIGTERM starts the drain; SIGKILL only after grace + margin.
        "KillSignal=SIGTERM",
        # SIGTERM to the daemon alone (it drains its own workers); SIGKILL to all.
        "KillMode=mixed",
        f"TimeoutStopSec={spec.stop_timeout_seconds}",
        *(environment_line(k, v) for k, v in spec.environment),
        # The API keys: read by systemd itself from an owner-only file, since
        # a system unit (and systemctl show) is readable by every user.
        *([f"EnvironmentFile={_escape_specifiers(str(secrets_path))}"] if secrets_path and spec.secrets else []),
        f"WorkingDirectory={_escape_specifiers(str(spec.working_directory))}",
    ]
    if target.system and spec.run_as_user:
        service.append(f"User={spec.run_as_user}")
    sections = {
        "Unit": [
            "Description=mlxd: local MLX models behind an OpenAI-compatible API",
            "After=network.target",
        ],
        "Service": service,
        "Install": [f"WantedBy={'multi-user.target' if target.system else 'default.target'}"],
    }
    return "\n\n".join(_section(name, lines) for name, lines in sections.items()) + "\n"


def _section(name: str, lines: Iterable[str]) -> str:
    return "\n".join([f"[{name}]", *lines])


@dataclass(frozen=True)
class SystemdManager:
    target: ServiceTarget

    @property
    def unit(self) -> str:
        return unit_name(self.target.label)

    @property
    def unit_path(self) -> Path:
        folder = (
            Path("/etc/systemd/system")
            if self.target.system
            else self.target.home / ".config" / "systemd" / "user"
        )
        return folder / self.unit

    @property
    def file_mode(self) -> int:
        # A system unit's settings are readable by anyone through systemctl
        # show anyway (systemd warns about 0600 there); a user unit is private.
        return 0o644 if self.target.system else 0o600

    def _scope(self) -> tuple[str, ...]:
        return () if self.target.system else ("--user",)

    def _systemctl(self, *args: str) -> Command:
        return Command(("systemctl", *self._scope(), *args))

    @property
    def secrets_path(self) -> Path:
        folder = Path("/etc/mlxd") if self.target.system else self.target.home / ".config" / "mlxd"
        return folder / f"{self.unit.removesuffix('.service')}.env"

    @property
    def state_base(self) -> Path | None:
        """The daemon's default state dir for a user unit (mlxd.settings);
        a system unit's user's home is not known here."""
        return None if self.target.system else self.target.home / ".local" / "state" / "mlxd"

    def render(self, spec: ServiceSpec) -> bytes:
        return render_unit(spec, self.secrets_path).encode("utf-8")

    def secret_file(self, spec: ServiceSpec) -> WriteFile | None:
        if not spec.secrets:
            return None
        # systemd reads it as root before starting the service: root-owned is fine.
        content = "".join(environment_file_line(k, v) for k, v in spec.secrets)
        return WriteFile(self.secrets_path, content.encode("utf-8"), 0o600, secret=True)

    def directories(self, spec: ServiceSpec) -> tuple[MakeDirectory, ...]:
        return (MakeDirectory(self.unit_path.parent),)

    def start_new(self) -> tuple[Command, ...]:
        return (self._systemctl("daemon-reload"), self._systemctl("enable", "--now", self.unit))

    def stop_before_replace(self) -> tuple[Command, ...]:
        # systemd rereads the file on daemon-reload; nothing to stop first.
        return ()

    def start_replaced(self) -> tuple[Command, ...]:
        return (
            self._systemctl("daemon-reload"),
            self._systemctl("enable", self.unit),
            # Restarts a running unit onto the new file, or starts a stopped one.
            self._systemctl("restart", self.unit),
        )

    def uninstall_steps(self, installed: bool) -> tuple[Step, ...]:
        if not installed:
            return ()
        return (
            self._systemctl("disable", "--now", self.unit),
            RemoveFile(self.unit_path),
            self._systemctl("daemon-reload"),
        )

    def status(self) -> Command:
        return self._systemctl("status", "--no-pager", self.unit)

    def restart(self) -> Command:
        return self._systemctl("restart", self.unit)

    def logs(self, *, follow: bool, lines: int) -> Command:
        follow_flag = ("-f",) if follow else ()
        return Command(
            ("journalctl", *self._scope(), "-u", self.unit, "-n", str(lines), "--no-pager", *follow_flag)
        )
