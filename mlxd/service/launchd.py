"""macOS: a launchd agent (per user) or daemon (``--system``).

The plist comes from the packaged template (a copy of
``launchd/com.mlxd.daemon.plist.template`` at the repository root): every
string that is exactly ``@NAME@`` is replaced by a computed value, so the
template stays the one list of keys and constant values.
"""

from __future__ import annotations

import plistlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mlxd.service.steps import Command, MakeDirectory, RemoveFile, Step, WriteFile
from mlxd.service.spec import ServiceSpec, ServiceTarget

TEMPLATE_NAME = "com.mlxd.daemon.plist.template"
_PLACEHOLDER = re.compile(r"^@([A-Z_]+)@$")
# `launchctl bootout` of a service that is not loaded: ESRCH (3) on current
# macOS, 113 ("Could not find specified service") on some versions.
NOT_LOADED_CODES = frozenset({3, 113})


class _Absent:
    """A placeholder value that removes its key from the rendered plist."""


ABSENT = _Absent()


def template_text() -> bytes:
    return resources.files("mlxd.service").joinpath("templates", TEMPLATE_NAME).read_bytes()


def fill_template(template: bytes, values: Mapping[str, Any]) -> dict[str, Any]:
    """Parse the template and substitute placeholders; every value must be used."""
    used: set[str] = set()

    def fill(node: Any) -> Any:
        if isinstance(node, str):
            match = _PLACEHOLDER.match(node)
            if not match:
                return node
            name = match.group(1)
            if name not in values:
                raise KeyError(f"template placeholder @{name}@ has no value")
            used.add(name)
            return values[name]
        if isinstance(node, dict):
            filled = {key: fill(value) for key, value in node.items()}
            return {key: value for key, value in filled.items() if value is not ABSENT}
        if isinstance(node, list):
            return [fill(item) for item in node]
        return node

    document = fill(plistlib.loads(template))
    unused = set(values) - used
    if unused:
        raise KeyError(f"values without a placeholder in the template: {sorted(unused)}")
    return document


@dataclass(frozen=True)
class LaunchdManager:
    target: ServiceTarget

    @property
    def domain(self) -> str:
        return "system" if self.target.system else f"gui/{self.target.uid}"

    @property
    def service(self) -> str:
        return f"{self.domain}/{self.target.label}"

    @property
    def unit_path(self) -> Path:
        folder = (
            Path("/Library/LaunchDaemons")
            if self.target.system
            else self.target.home / "Library" / "LaunchAgents"
        )
        return folder / f"{self.target.label}.plist"

    @property
    def file_mode(self) -> int:
        # Per-user: it can hold MLXD_* secrets. System daemons are root-owned
        # and conventionally world-readable.
        return 0o644 if self.target.system else 0o600

    @property
    def log_dir(self) -> Path:
        if self.target.system:
            return Path("/Library/Logs/mlxd")
        return self.target.home / "Library" / "Logs" / "mlxd"

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"{self.target.label}.out.log"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.target.label}.err.log"

    @property
    def secrets_path(self) -> Path:
        base = Path("/Library") if self.target.system else self.target.home / "Library"
        return base / "Application Support" / "mlxd" / f"{self.target.label}.api-keys"

    @property
    def state_base(self) -> Path | None:
        """The daemon's default state dir for a user agent (mlxd.settings);
        a system daemon's user's home is not known here."""
        return None if self.target.system else self.target.home / "Library" / "Application Support" / "mlxd"

    def secret_file(self, spec: ServiceSpec) -> WriteFile | None:
        """launchd has no EnvironmentFile: the daemon reads the keys itself
        (MLXD_API_KEYS_FILE), one a line, from a file only its user can read."""
        keys = [k.strip() for name, value in spec.secrets if name == "MLXD_API_KEYS" for k in value.split(",")]
        keys = [k for k in keys if k]
        if not keys:
            return None
        owner = spec.run_as_user if self.target.system else None
        content = "".join(f"{k}\n" for k in keys).encode("utf-8")
        return WriteFile(self.secrets_path, content, 0o600, owner=owner, secret=True)

    def render(self, spec: ServiceSpec) -> bytes:
        environment = dict(spec.environment)
        if self.secret_file(spec) is not None:
            environment["MLXD_API_KEYS_FILE"] = str(self.secrets_path)
        values: dict[str, Any] = {
            "LABEL": self.target.label,
            "PYTHON": spec.python,
            "CONFIG": str(spec.config_path),
            "EXIT_TIMEOUT": spec.stop_timeout_seconds,
            "STDOUT_PATH": str(self.stdout_path),
            "STDERR_PATH": str(self.stderr_path),
            "ENVIRONMENT": dict(sorted(environment.items())),
            "WORKING_DIRECTORY": str(spec.working_directory),
            "USER_NAME": spec.run_as_user if self.target.system and spec.run_as_user else ABSENT,
        }
        document = fill_template(template_text(), values)
        return plistlib.dumps(document, sort_keys=False)

    def directories(self, spec: ServiceSpec) -> tuple[MakeDirectory, ...]:
        owner = spec.run_as_user if self.target.system else None
        return (MakeDirectory(self.unit_path.parent), MakeDirectory(self.log_dir, owner=owner))

    def _launchctl(self, *args: str, tolerate_not_loaded: bool = False) -> Command:
        codes = NOT_LOADED_CODES if tolerate_not_loaded else frozenset()
        return Command(("launchctl", *args), not_loaded_codes=codes)

    def start_new(self) -> tuple[Command, ...]:
        return (
            self._launchctl("bootstrap", self.domain, str(self.unit_path)),
            self._launchctl("enable", self.service),
            # -k: if RunAtLoad already started it, restart rather than fail.
            self._launchctl("kickstart", "-k", self.service),
        )

    def stop_before_replace(self) -> tuple[Command, ...]:
        # launchd keeps the plist it loaded; a changed file only counts after
        # bootout + bootstrap.
        return (self._launchctl("bootout", self.service, tolerate_not_loaded=True),)

    def start_replaced(self) -> tuple[Command, ...]:
        return self.start_new()

    def uninstall_steps(self, installed: bool) -> tuple[Step, ...]:
        # Boot out even without a file: a loaded job whose plist was deleted by
        # hand would otherwise block the next install ("bootstrap failed: 5").
        bootout = self._launchctl("bootout", self.service, tolerate_not_loaded=True)
        return (bootout, RemoveFile(self.unit_path)) if installed else (bootout,)

    def status(self) -> Command:
        return self._launchctl("print", self.service)

    def restart(self) -> Command:
        return self._launchctl("kickstart", "-k", self.service)

    def logs(self, *, follow: bool, lines: int) -> Command:
        # -F keeps following across log rotation and files not yet created.
        follow_flag = ("-F",) if follow else ()
        return Command(
            ("tail", "-n", str(lines), *follow_flag, str(self.stdout_path), str(self.stderr_path))
        )
