"""What the HTTP layer serves from: settings, the residency manager, the
configuration's state, events and metrics. Built by ``build_daemon`` (the
composition root in ``mlxd.daemon.build``); nothing lives at module level, so
tests build as many as they like."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from mlxd.api.app_limits import AppLimits
from mlxd.api.limits import DAY
from mlxd.api.capture import CaptureStore
from mlxd.api.images import ImageMemory
from mlxd.api.inflight import InFlight
from mlxd.distributed.hosting import RankHosting
from mlxd.engine.token_count import TokenCounter
from mlxd.engine.worker import MlxWorker
from mlxd.failover.router import FailoverRouter
from mlxd.monitoring.activity import ActivityLog
from mlxd.monitoring.history import History
from mlxd.monitoring.metrics import Metrics
from mlxd.monitoring.usage import UsageBook
from mlxd.monitoring.telemetry import Telemetry
from mlxd.monitoring.snapshot import ConfigState, DaemonSnapshot
from mlxd.monitoring.status import EVENTS_LIMIT
from mlxd.registry.model import Registry, ServerSpec
from mlxd.remote.backends import BackendPool
from mlxd.residency.decisions import EventLog
from mlxd.residency.shell import ResidencyManager
from mlxd.settings import EffectiveSettings

@dataclass
class DaemonContext:
    settings: EffectiveSettings
    manager: ResidencyManager
    worker: MlxWorker
    config: ConfigState
    events: EventLog
    metrics: Metrics = field(default_factory=Metrics)
    started_at: float = field(default_factory=time.time)
    # Set on SIGTERM: new requests get 503 while in-flight ones finish.
    draining: bool = False
    blas: dict[str, Any] = field(default_factory=dict)
    # /v1/messages/count_tokens: tokenizers read apart from the engines.
    token_counter: TokenCounter = field(default_factory=TokenCounter)
    # Decoded image pixels held at once, across every request.
    image_memory: ImageMemory = field(default_factory=lambda: ImageMemory(ServerSpec().max_image_memory_bytes))
    backends: BackendPool = field(default_factory=lambda: BackendPool(()))
    # The requests under way, by X-Request-Id and response id (cancel routes).
    inflight: InFlight = field(default_factory=InFlight)
    # Captured prompts, outputs and cache decisions (off unless an admin asks).
    captures: CaptureStore = field(default_factory=CaptureStore)
    # Finished requests, one row each, in sqlite (None: not kept).
    activity: ActivityLog | None = None
    # The last hour of samples the dashboard charts (None: not kept).
    history: History | None = None
    # OpenTelemetry (None: not configured).
    telemetry: Telemetry | None = None
    # Ranks this daemon runs for another machine's gang (api/routes/gang.py).
    hosting: RankHosting = field(default_factory=RankHosting)
    # Each app's limits (rpm, tpm, tokens per day, requests at once).
    limits: AppLimits = field(default_factory=AppLimits)
    # Requests and tokens per app and model, since the state directory began.
    usage: UsageBook = field(default_factory=UsageBook)
    # Failover entries: the target order per request, and what each target did.
    failover: FailoverRouter = field(init=False)

    def __post_init__(self) -> None:
        self.failover = FailoverRouter(self.manager, self.backends)

    def follow(self, registry: Registry) -> None:
        """A reloaded registry, handed to every part that keeps a view of it
        besides the residency manager (its reconfigure is async and reports
        what it preloads). One call for the reloader, whatever the parts."""
        for part in (self.backends, self.failover):
            part.follow(registry)

    def restore_usage(self) -> None:
        """What the activity log kept of earlier runs: the usage totals, and
        the tokens each caller has spent since midnight UTC (its day limit)."""
        if self.activity is None:
            return
        self.usage.restore(self.activity.usage_totals())
        now = self.limits.clock()
        for caller, tokens in self.activity.tokens_since(now - now % DAY):
            self.limits.book.restore_day(caller, int(tokens or 0), now)

    @property
    def registry(self) -> Registry:
        return self.manager.registry

    def snapshot(self) -> DaemonSnapshot:
        """Everything /v1/status, /health and /metrics show, read at once."""
        manager = self.manager.snapshot()
        server = self.settings.server
        throughput = self.metrics.throughput
        return DaemonSnapshot(
            manager=manager,
            config=replace(self.config),
            events=tuple(self.events.recent(EVENTS_LIMIT)),
            recent_tokens={m.name: throughput.tokens(m.name) for m in manager.models},
            window_seconds=throughput.window_seconds,
            recent_busy={m.name: throughput.busy_seconds(m.name) for m in manager.models},
            started_at=self.started_at,
            draining=self.draining,
            blas=dict(self.blas),
            host=server.host,
            port=server.port,
            auth_required=bool(server.api_keys or server.read_only_keys or self.registry.apps is not None),
            metrics_enabled=self.settings.metrics,
            backends=self.backends.views(),
            failovers=self.failover.views(),
            usage=tuple(self.usage.rows()),
            apps=self._apps_now(),
        )

    def _apps_now(self) -> tuple[dict[str, Any], ...]:
        apps = self.registry.apps or ()
        under_way = Counter(entry.caller for entry in self.inflight.entries())
        return tuple({"name": app.name, "priority": app.priority, "admin": app.admin,
                      "in_flight": under_way.get(app.name, 0), "limits": self.limits.room(app)} for app in apps)
