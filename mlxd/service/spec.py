"""What a service install needs to know, gathered once from the environment.

Everything platform-specific (plist, unit file, commands) is derived from one
``ServiceSpec``; nothing downstream reads ``os.environ`` or the config file.
"""

from __future__ import annotations

import getpass
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlxd.settings import create_config_hint
from mlxd.errors import ConfigError
from mlxd.registry.document import Document
from mlxd.registry.kinds import KINDS
from mlxd.registry.model import ServerSpec
from mlxd.registry.schema import physical_memory_bytes

DEFAULT_LABEL = "com.mlxd.daemon"
# launchd labels are reverse-DNS names; systemd unit names allow the same set.
_LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# SIGTERM to SIGKILL must outlast the drain, or a slow drain ends in a kill
# (which KeepAlive / Restart=on-failure then count as a crash).
STOP_TIMEOUT_MARGIN_SECONDS = 30
RESTART_DELAY_SECONDS = 10
# Never written into the unit or plist (a system one is world-readable): they
# go into an owner-only file beside it (see the managers' secret_file).
SECRET_VARIABLES = frozenset({"MLXD_API_KEYS"})
# The client tools' key (mlxd status, reload); the daemon never reads it.
CLIENT_ONLY_VARIABLES = frozenset({"MLXD_API_KEY"})


@dataclass(frozen=True)
class ServiceTarget:
    """Which service: enough to find its file and drive it, no config needed."""

    label: str
    home: Path
    uid: int
    # System-wide (launchd system domain / systemd system manager) instead of per-user.
    system: bool = False


@dataclass(frozen=True)
class ServiceSpec:
    """Everything the unit file says."""

    target: ServiceTarget
    config_path: Path
    python: str
    working_directory: Path
    # PATH and every MLXD_* variable but the secrets, sorted by name so
    # renders are stable.
    environment: tuple[tuple[str, str], ...]
    shutdown_grace_seconds: float
    # Who a system-wide service runs as (never root by accident).
    run_as_user: str | None = None
    # SECRET_VARIABLES that were set, for the owner-only secrets file.
    secrets: tuple[tuple[str, str], ...] = ()

    @property
    def stop_timeout_seconds(self) -> int:
        return math.ceil(self.shutdown_grace_seconds) + STOP_TIMEOUT_MARGIN_SECONDS

    @property
    def serve_argv(self) -> tuple[str, ...]:
        return (self.python, "-m", "mlxd", "serve", "--config", str(self.config_path))


def validate_label(label: str) -> str:
    if not _LABEL_PATTERN.match(label):
        raise ConfigError(
            "must start with a letter or digit and use only letters, digits, '.', '_' and '-'",
            key="--label",
        )
    return label


def service_environment(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """PATH plus every MLXD_* variable the daemon reads besides its config,
    secrets excepted."""
    skip = SECRET_VARIABLES | CLIENT_ONLY_VARIABLES
    chosen = {k: v for k, v in environ.items() if k.startswith("MLXD_") and k not in skip}
    if "PATH" in environ:
        chosen["PATH"] = environ["PATH"]
    return tuple(sorted(chosen.items()))


def instance_environment(
    environment: tuple[tuple[str, str], ...], label: str, state_base: Path | None
) -> tuple[tuple[str, str], ...]:
    """A second instance (any label but the default) gets a state directory
    of its own: the daemon takes one lock per state directory, so two
    services on the default one had the second exit at every start (and
    launchd restart it every 10 s). An MLXD_STATE_DIR set at install wins."""
    chosen = dict(environment)
    if label == DEFAULT_LABEL or state_base is None or "MLXD_STATE_DIR" in chosen:
        return environment
    chosen["MLXD_STATE_DIR"] = str(state_base / label)
    return tuple(sorted(chosen.items()))


def service_secrets(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in environ.items() if k in SECRET_VARIABLES))


def read_shutdown_grace(config_path: Path) -> float:
    """``server.shutdown_grace_seconds`` from the config, once the file passes
    the checks that need no model: its YAML and every key's type and range.
    A file the daemon would refuse at start is refused here (ConfigError,
    naming its line and key), rather than installed as a service that exits
    at once; the models themselves may be fetched after the install.
    """
    try:
        text = config_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise ConfigError("cannot be read", file=str(config_path)) from None
    document = Document.parse(text, str(config_path))
    return document.validate(physical_memory_bytes(), KINDS).server.shutdown_grace_seconds


def absolute_config_path(raw: Path, home: Path) -> Path:
    """As a shell would expand it, against this HOME, without resolving symlinks."""
    text = str(raw)
    if text == "~" or text.startswith("~/"):
        text = str(home) + text[1:]
    return Path(os.path.abspath(text))


def build_target(*, label: str, system: bool, environ: Mapping[str, str]) -> ServiceTarget:
    """Raises ConfigError (exit status 2) for a label launchd or systemd would reject."""
    validate_label(label)
    home = Path(environ.get("HOME") or Path.home())
    return ServiceTarget(label=label, home=home, uid=os.getuid(), system=system)


def build_service_spec(
    *,
    target: ServiceTarget,
    config: Path,
    environ: Mapping[str, str],
    python: str,
    allow_missing: bool = False,
    state_base: Path | None = None,
) -> ServiceSpec:
    """Raises ConfigError (exit status 2) for a missing or unreadable config.
    ``allow_missing`` (a dry run) plans around a file not written yet.
    ``state_base``: where the daemon keeps its state by default, as the
    service will run it (None: not known here; see ``instance_environment``)."""
    config_path = absolute_config_path(config, target.home)
    missing = not config_path.exists()
    if missing and not allow_missing:
        raise ConfigError(
            f"config file does not exist; {create_config_hint(config_path)}", file=str(config_path)
        )
    if not missing and not config_path.is_file():
        raise ConfigError("is not a file (give the path of the models.yaml)", file=str(config_path))
    return ServiceSpec(
        target=target,
        config_path=config_path,
        python=python,
        working_directory=config_path.parent,
        environment=instance_environment(service_environment(environ), target.label, state_base),
        shutdown_grace_seconds=ServerSpec().shutdown_grace_seconds if missing else read_shutdown_grace(config_path),
        run_as_user=invoking_user(environ) if target.system else None,
        secrets=service_secrets(environ),
    )


def invoking_user(environ: Mapping[str, str]) -> str:
    """The human behind ``sudo``, so a system service is not installed to run as root."""
    return environ.get("SUDO_USER") or environ.get("USER") or getpass.getuser()
