"""Daemon settings: CLI flags > MLXD_* environment > models.yaml ``server:`` > defaults.

pydantic-settings reads the environment; the CLI passes its flags as init
values (which outrank the environment); whatever neither set explicitly is
then taken from the registry's ``server:`` section.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mlxd.registry.model import ServerSpec


def default_state_dir() -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "mlxd"
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base else Path.home() / ".local" / "state") / "mlxd"


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
    default_max_tokens: int | None = Field(default=None, ge=1)
    max_request_tokens: int | None = Field(default=None, ge=1)
    request_timeout_s: float | None = Field(default=None, gt=0)
    shutdown_grace_seconds: float | None = Field(default=None, ge=0)
    state_dir: Path = Field(default_factory=default_state_dir)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "info"
    # Prompts are private: request logs never carry them unless asked.
    log_prompts: bool = False
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    metrics: bool = True
    watch_config: bool = True

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.lower() not in ("debug", "info", "warning", "error", "critical"):
            raise ValueError("must be one of debug, info, warning, error, critical")
        return value.lower()

    def api_key_list(self) -> tuple[str, ...] | None:
        if self.api_keys is None:
            return None
        return tuple(k.strip() for k in self.api_keys.split(",") if k.strip())


# Fields that exist both as settings and in the registry's server section.
SERVER_FIELDS = (
    "host",
    "port",
    "default_max_tokens",
    "max_request_tokens",
    "request_timeout_s",
    "shutdown_grace_seconds",
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


def effective(settings: DaemonSettings, server: ServerSpec) -> EffectiveSettings:
    """Merge explicit settings (CLI or environment) over the registry's section."""
    overrides: dict[str, Any] = {
        name: getattr(settings, name)
        for name in SERVER_FIELDS
        if getattr(settings, name) is not None
    }
    keys = settings.api_key_list()
    if keys is not None:
        overrides["api_keys"] = keys
    return EffectiveSettings(
        server=replace(server, **overrides),
        state_dir=settings.state_dir.expanduser(),
        log_format=settings.log_format,
        log_level=settings.log_level,
        log_prompts=settings.log_prompts,
        heartbeat_seconds=settings.heartbeat_seconds,
        metrics=settings.metrics,
        watch_config=settings.watch_config,
    )
