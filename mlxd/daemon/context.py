"""The one object the app is built around: settings, registry state, the
residency manager, the MLX worker, events and metrics. Nothing lives at module
level; tests build as many contexts as they like."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxd.daemon.images import ImageMemory
from mlxd.daemon.metrics import Metrics
from mlxd.daemon.settings import EffectiveSettings
from mlxd.engine.cache_store.bound import CacheDirBound
from mlxd.engine.types import Engine
from mlxd.engine.worker import MlxWorker
from mlxd.errors import ConfigError, ModelLoadFailed
from mlxd.registry.model import ModelSpec, Registry, ServerSpec
from mlxd.residency.events import EventLog
from mlxd.residency.footprints import FootprintStore
from mlxd.residency.shell import ResidencyManager

if TYPE_CHECKING:
    from mlxd.daemon.generation import Plan

log = logging.getLogger("mlxd.requests")


@dataclass
class ConfigState:
    """What /v1/status says about models.yaml."""

    path: Path | None
    generation: int
    file_hash: str
    applied_at: float
    last_reload: dict[str, Any] | None = None
    # The file on disk is invalid: the previous registry keeps serving.
    error: ConfigError | None = None


class EngineFactory:
    """Builds the right engine for a spec on the shared worker.

    ``cache_dir`` gives the manager's cache dir at load time (hot reload may
    change it); text models persist their prefix cache under it.
    """

    def __init__(self, worker: MlxWorker, cache_dir: Callable[[], Path] | None = None) -> None:
        self.worker = worker
        self.cache_dir = cache_dir

    async def __call__(self, spec: ModelSpec) -> Engine:
        if spec.kind == "vision":
            try:
                from mlxd.engine.vision import load_vision_engine
            except ImportError as exc:
                raise ModelLoadFailed(
                    f"Model `{spec.name}` is a vision model but mlx-vlm is not installed "
                    "(pip install 'mlxd[vision]')"
                ) from exc
            return await load_vision_engine(spec, self.worker)
        from mlxd.engine.loader import load_text_engine

        cache_dir = self.cache_dir() if self.cache_dir is not None else None
        return await load_text_engine(spec, self.worker, cache_dir=cache_dir)


class PrefixCacheHooks:
    """The daemon's lifecycle hooks: let an engine save what outlives it (its
    prefix cache) before it unloads (idle, eviction, admin, reload or
    shutdown), then keep this daemon's folders under ``<cache_dir>/prefix``
    within the sum of the models' disk bounds (``cache_store/bound.py``: safe
    when several daemons share the cache dir).

    The save's MLX part runs on the worker and its file I/O in a thread, one
    entry at a time: the event loop and other models keep going meanwhile.
    """

    def __init__(self, registry: Callable[[], Registry]) -> None:
        self._registry = registry
        self._bound = CacheDirBound()

    async def before_unload(self, spec: ModelSpec, engine: Engine, reason: str) -> None:
        saved = await engine.before_unload()
        if saved is None:
            return
        registry = self._registry()
        total = sum(
            m.prefix_cache.disk_max_bytes for m in registry.models if m.prefix_cache.persist
        )
        try:
            await asyncio.to_thread(self._bound.enforce, saved.root, total, saved.fingerprint)
        except OSError as exc:
            log.warning("bounding the prefix cache dir %s failed: %s", saved.root, exc)


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
    # Decoded image pixels held at once, across every request.
    image_memory: ImageMemory = field(default_factory=lambda: ImageMemory(ServerSpec().max_image_memory_bytes))

    def __post_init__(self) -> None:
        self.metrics.attach(self)

    @property
    def registry(self) -> Registry:
        return self.manager.registry

    @classmethod
    def create(
        cls,
        settings: EffectiveSettings,
        registry: Registry,
        *,
        worker: MlxWorker | None = None,
        factory: Any = None,
        hooks: Any = None,
    ) -> DaemonContext:
        worker = worker or MlxWorker()
        events = EventLog()
        footprints = FootprintStore(settings.state_dir / "footprints.json")
        metrics = Metrics()
        engines = factory or EngineFactory(worker)
        # The lambdas read the manager's live registry: hot reload replaces it.
        manager = ResidencyManager(
            registry,
            engines,
            events=events,
            hooks=hooks or PrefixCacheHooks(lambda: manager.registry),
            recall=footprints.known,
            on_measured=footprints.remember,
            observer=metrics,
        )
        if isinstance(engines, EngineFactory) and engines.cache_dir is None:
            engines.cache_dir = lambda: manager.registry.manager.cache_dir
        config = ConfigState(
            path=registry.source_path, generation=1, file_hash=registry.file_hash, applied_at=time.time()
        )
        return cls(
            settings=settings, manager=manager, worker=worker, config=config, events=events, metrics=metrics,
            image_memory=ImageMemory(settings.server.max_image_memory_bytes),
        )

    def record_request(
        self, model: str, status: int, plan: Plan, tokens_in: int = 0, tokens_out: int = 0
    ) -> None:
        seconds = time.monotonic() - plan.started
        self.metrics.requests.labels(model, str(status)).inc()
        self.metrics.request_seconds.labels(model).observe(seconds)
        if tokens_in:
            self.metrics.tokens.labels(model, "in").inc(tokens_in)
        if tokens_out:
            self.metrics.tokens.labels(model, "out").inc(tokens_out)
        stats = self.manager.stats.get(model)
        if stats is not None:
            stats.tokens_in += tokens_in
            stats.tokens_out += tokens_out
        extra = ""
        if self.settings.log_prompts:
            extra = " prompt=" + repr([r.messages or r.prompt for r in plan.requests])[:2000]
        log.info(
            "%s model=%s status=%d tokens_in=%d tokens_out=%d seconds=%.3f stream=%s%s",
            plan.kind, model, status, tokens_in, tokens_out, seconds, plan.stream, extra,
        )
