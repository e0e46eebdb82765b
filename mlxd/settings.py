"""Daemon settings: CLI flags > MLXD_* environment > models.yaml ``server:`` > defaults.

pydantic-settings reads the environment; the CLI passes its flags as init
values (which outrank the environment); whatever neither set explicitly is
then taken from the registry's ``server:`` section.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mlxd.errors import ConfigError
from mlxd.registry.model import ServerSpec

log = logging.getLogger("mlxd")


def default_state_dir() -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "mlxd"
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base else Path.home() / ".local" / "state") / "mlxd"


def default_config_path(
    environ: Mapping[str, str] | None = None, *, macos: bool | None = None
) -> Path:
    """Where ``serve``, ``check`` and ``service install`` look for the
    registry when no ``--config`` (or ``MLXD_CONFIG``) names one."""
    environ = os.environ if environ is None else environ
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "darwin" if macos is None else macos:
        return home / "Library" / "Application Support" / "mlxd" / "models.yaml"
    base = environ.get("XDG_CONFIG_HOME")
    return (Path(base) if base else home / ".config") / "mlxd" / "models.yaml"


def create_config_hint(path: Path) -> str:
    """How to make the registry a command found missing."""
    return (
        f"create it with `mlxd demo {shlex.quote(str(path.parent))}` (a registry of small demo "
        "models to edit) or write one (docs/registry.md)"
    )


def default_demo_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "mlxd" / "demo"


class DaemonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MLXD_", extra="ignore")

    config: Path | None = None
    host: str | None = None
    port: int | None = Field(default=None, ge=0, le=65535)
    # Comma-separated in the environment: MLXD_API_KEYS=key1,key2
    api_keys: str | None = None
    # Keys one a line, from a file only the daemon's user can read: how a
    # service keeps them out of its unit or plist. --api-key and
    # MLXD_API_KEYS win over it; it is read again on every reload.
    api_keys_file: Path | None = None
    default_max_tokens: int | None = Field(default=None, ge=1)
    max_request_tokens: int | None = Field(default=None, ge=1)
    request_timeout_s: float | None = Field(default=None, gt=0)
    shutdown_grace_seconds: float | None = Field(default=None, ge=0)
    max_body_bytes: int | None = Field(default=None, ge=1024)
    max_prompts: int | None = Field(default=None, ge=1)
    max_connections: int | None = Field(default=None, ge=1)
    header_timeout_s: float | None = Field(default=None, gt=0)
    body_timeout_s: float | None = Field(default=None, gt=0)
    send_timeout_s: float | None = Field(default=None, gt=0)
    # Comma-separated in the environment, like api_keys.
    allowed_hosts: str | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "info"
    # Prompts are private: request logs never carry them unless asked.
    log_prompts: bool = False
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    # The dashboard's history: one sample this often, for the last hour.
    history_step_seconds: float = Field(default=5.0, ge=0.1, le=60)
    # OpenTelemetry over OTLP/HTTP (http://collector:4318); off when unset.
    otlp_endpoint: str | None = None
    metrics: bool = True
    watch_config: bool = True

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError("must be one of debug, info, warning, error, critical")
        return value.lower()

    def api_key_list(self) -> tuple[str, ...] | None:
        """None: take the registry's ``server.api_keys``. Raises ConfigError
        for a keys file that cannot be used."""
        # MLXD_API_KEYS="" (or ",") lists no key: it must not replace the
        # registry's keys with none and so open the daemon.
        keys = _split(self.api_keys)
        if keys:
            return keys
        if self.api_keys_file is not None:
            return read_api_keys_file(self.api_keys_file.expanduser())
        return None

    def allowed_host_list(self) -> tuple[str, ...] | None:
        return _split(self.allowed_hosts) or None


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(k.strip() for k in (value or "").split(",") if k.strip())


def read_api_keys_file(path: Path) -> tuple[str, ...]:
    """One key a line; blank lines and ``#`` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read the API keys file: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError:
        raise ConfigError("the API keys file is not UTF-8 text", file=str(path)) from None
    keys = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not keys:
        # An empty file must not quietly turn authentication off.
        raise ConfigError("the API keys file holds no key", file=str(path))
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s can be read by other users; chmod 600 it", path)
    return keys


# Fields that exist both as settings and in the registry's server section.
SERVER_FIELDS = (
    "host",
    "port",
    "default_max_tokens",
    "max_request_tokens",
    "request_timeout_s",
    "shutdown_grace_seconds",
    "max_body_bytes",
    "max_prompts",
    "max_connections",
    "header_timeout_s",
    "body_timeout_s",
    "send_timeout_s",
)


@dataclass(frozen=True)
class EffectiveSettings:
    """What the daemon actually runs with, every source merged."""

    server: ServerSpec
    state_dir: Path
    log_format: str
    log_level: str
    log_prompts: bool
    heartbeat_seconds: float
    metrics: bool
    watch_config: bool
    history_step_seconds: float = 5.0
    otlp_endpoint: str | None = None


def effective(settings: DaemonSettings, server: ServerSpec) -> EffectiveSettings:
    """Merge explicit settings (CLI or environment) over the registry's section."""
    overrides: dict[str, Any] = {
        name: getattr(settings, name)
        for name in SERVER_FIELDS
        if getattr(settings, name) is not None
    }
    if settings.host is not None and not settings.host.strip():
        # As `host: ""` in the registry: the wildcard, every interface.
        raise ConfigError("--host (or MLXD_HOST) is empty, which would listen on every interface; "
                          "write 0.0.0.0 for that, or leave it out for the registry's host")
    keys = settings.api_key_list()
    if keys is not None:
        overrides["api_keys"] = keys
    elif settings.api_keys is not None and not server.api_keys:
        # `--api-key "$KEY"` with $KEY unset: the daemon would serve without
        # authentication, the opposite of what was asked. (With keys in the
        # registry, an empty list leaves them in force.)
        raise ConfigError("--api-key (or MLXD_API_KEYS) is set but names no key, and the registry names none: "
                          "mlxd would serve without authentication; give a key, or leave the option out")
    for key in keys or ():
        if any(ch.isspace() for ch in key):
            raise ConfigError("an API key from --api-key, MLXD_API_KEYS or the keys file has a space inside it; "
                              "a key is one word (the key itself is not shown)")
    hosts = settings.allowed_host_list()
    if hosts is not None:
        overrides["allowed_hosts"] = hosts
    return EffectiveSettings(
        server=replace(server, **overrides),
        state_dir=settings.state_dir.expanduser(),
        log_format=settings.log_format,
        log_level=settings.log_level,
        log_prompts=settings.log_prompts,
        heartbeat_seconds=settings.heartbeat_seconds,
        history_step_seconds=settings.history_step_seconds,
        otlp_endpoint=settings.otlp_endpoint or None,
        metrics=settings.metrics,
        watch_config=settings.watch_config,
    )
