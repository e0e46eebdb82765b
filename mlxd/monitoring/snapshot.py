"""What monitoring reads: one snapshot of the daemon, taken at one instant.

The status document and the Prometheus collector are functions of this
value; neither holds the daemon, the manager or the settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError
from mlxd.failover.router import FailoverView
from mlxd.remote.backends import BackendView
from mlxd.residency.decisions import Event
from mlxd.residency.shell import ManagerSnapshot


@dataclass
class ConfigState:
    """What /v1/status says about models.yaml (the reloader keeps it)."""

    path: Path | None
    generation: int
    file_hash: str
    applied_at: float
    last_reload: dict[str, Any] | None = None
    # The file on disk is invalid: the previous registry keeps serving.
    error: ConfigError | None = None


@dataclass(frozen=True)
class DaemonSnapshot:
    manager: ManagerSnapshot
    config: ConfigState
    events: tuple[Event, ...]
    # Output tokens per model within the throughput window, and its length.
    recent_tokens: dict[str, int]
    window_seconds: float
    # Seconds of that window each model had a request under way.
    recent_busy: dict[str, float]
    started_at: float
    draining: bool
    blas: dict[str, Any]
    host: str
    port: int
    auth_required: bool
    metrics_enabled: bool
    backends: tuple[BackendView, ...] = ()
    failovers: tuple[FailoverView, ...] = ()
    # Per app and model (monitoring/usage.py rows).
    usage: tuple[dict[str, Any], ...] = ()
    # Each app of ``apps:`` now: its class, its requests under way and its limits' room.
    apps: tuple[dict[str, Any], ...] = ()

    def recent_rate(self, model: str) -> float:
        return self.recent_tokens.get(model, 0) / self.window_seconds

    def busy_rate(self, model: str) -> float:
        """Output tokens per busy second: the model's speed, not its use."""
        busy = self.recent_busy.get(model, 0.0)
        return self.recent_tokens.get(model, 0) / busy if busy > 0 else 0.0
