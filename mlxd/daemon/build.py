"""The composition root: every object of a daemon is made and connected
here, once. ``mlxd serve`` and every test harness call ``build_daemon``;
nothing is patched in afterwards."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import FastAPI

from mlxd.api.app import create_app
from mlxd.api.context import DaemonContext
from mlxd.api.images import ImageMemory
from mlxd.daemon.engines import ContractChecked, EngineFactory, PrefixCacheHooks
from mlxd.engine.preload import StartupImports
from mlxd.daemon.reload import DEFAULT_DEBOUNCE_S, Reloader
from mlxd.daemon.server import DaemonServer, build_server
from mlxd.engine.blas import blas_report
from mlxd.engine.worker import MlxWorker
from mlxd.monitoring.activity import ActivityLog
from mlxd.monitoring.history import History
from mlxd.monitoring.metrics import Metrics
from mlxd.monitoring.telemetry import Telemetry
from mlxd.monitoring.snapshot import ConfigState
from mlxd.registry.model import Registry
from mlxd.remote.backends import BackendPool
from mlxd.residency.decisions import EventLog
from mlxd.residency.footprints import FootprintStore
from mlxd.residency.shell import EngineFactory as BuildsEngines
from mlxd.residency.shell import ResidencyManager
from mlxd.settings import DaemonSettings, effective


@dataclass
class Daemon:
    ctx: DaemonContext
    app: FastAPI
    server: DaemonServer
    # None when the registry has no file to reload from.
    reloader: Reloader | None
    # The engines' libraries, imported in the background once serving starts.
    imports: StartupImports


def build_daemon(
    settings: DaemonSettings,
    registry: Registry,
    *,
    worker: MlxWorker | None = None,
    engines: BuildsEngines | None = None,
    reload_debounce_s: float = DEFAULT_DEBOUNCE_S,
    telemetry: Telemetry | None = None,
) -> Daemon:
    """A daemon serving ``registry``. ``settings`` are the CLI flags and
    environment (merged over the file's ``server:`` section here and at every
    reload). ``engines`` replaces the real engine factory (tests count or
    fake loads); ``worker`` is the MLX worker thread the engines run on;
    ``telemetry`` replaces the OTLP exporter that ``MLXD_OTLP_ENDPOINT`` asks for."""
    eff = effective(settings, registry.server)
    worker = worker or MlxWorker()
    events = EventLog()
    metrics = Metrics()
    footprints = FootprintStore(eff.state_dir / "footprints.json")
    backends = BackendPool(registry.backends)
    imports = StartupImports()
    manager = ResidencyManager(
        registry,
        ContractChecked(engines or EngineFactory(worker, backends, imports)),
        events=events,
        hooks=PrefixCacheHooks(),
        recall=footprints.known,
        on_measured=footprints.remember,
        observer=metrics,
    )
    config = ConfigState(
        path=registry.source_path, generation=1, file_hash=registry.file_hash, applied_at=time.time()
    )
    ctx = DaemonContext(
        settings=eff,
        manager=manager,
        worker=worker,
        config=config,
        events=events,
        metrics=metrics,
        blas=blas_report(),
        image_memory=ImageMemory(eff.server.max_image_memory_bytes),
        backends=backends,
        activity=ActivityLog(eff.state_dir),
        history=History(metrics.throughput, step_seconds=eff.history_step_seconds),
        telemetry=telemetry or (Telemetry.otlp(eff.otlp_endpoint) if eff.otlp_endpoint else None),
    )
    metrics.attach(ctx.snapshot)
    reloader = None
    if registry.source_path is not None:
        reloader = Reloader(ctx, settings, registry.source_path, debounce_s=reload_debounce_s)
    app = create_app(ctx, reloader)
    server = build_server(app, ctx, on_reload=reloader.on_signal if reloader else None)
    return Daemon(ctx=ctx, app=app, server=server, reloader=reloader, imports=imports)
