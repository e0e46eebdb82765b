"""How the daemon builds engines and what it does before one unloads. Both
are handed to the residency manager, which passes the registry in use with
every call (hot reload replaces it): nothing here reads the manager back."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from mlxd.engine.cache_store.bound import CacheDirBound
from mlxd.engine.contract import GenerationEngine
from mlxd.engine.kinds import named_function
from mlxd.engine.preload import StartupImports
from mlxd.engine.types import Engine
from mlxd.engine.worker import MlxWorker
from mlxd.errors import ModelLoadFailed
from mlxd.registry.model import ModelSpec, Registry
from mlxd.remote.backends import BackendPool
from mlxd.residency.shell import EngineFactory as BuildsEngines

log = logging.getLogger("mlxd.requests")


class EngineFactory:
    """Builds the right engine for a spec on the shared worker. Text models
    persist their prefix cache under the registry's ``cache_dir``."""

    def __init__(self, worker: MlxWorker, backends: BackendPool | None = None,
                 imports: StartupImports | None = None) -> None:
        self.worker = worker
        self.backends = backends
        self.imports = imports

    async def __call__(self, spec: ModelSpec, registry: Registry) -> Engine:
        kind = registry.kind_of(spec)
        if kind.engine is None:  # served by a backend
            if self.backends is None:
                raise ModelLoadFailed(f"Model `{spec.name}` is remote but this daemon has no backends")
            # Here, not at the top: a daemon with no remote entries never
            # imports aiohttp (half a second of a cold start).
            from mlxd.remote.engine import RemoteEngine

            return RemoteEngine(spec, self.backends)
        if self.imports is not None:
            await asyncio.to_thread(self.imports.wait)
        try:
            load = named_function(kind.engine)
        except ImportError as exc:
            hint = kind.install_hint or f"its engine ({kind.engine}) cannot be imported: {exc}"
            raise ModelLoadFailed(f"Model `{spec.name}` is a {kind.name} model but {hint}") from exc
        return await load(spec, self.worker, cache_dir=registry.manager.cache_dir)


class ContractChecked:
    """Any engine factory (the real one, or a test's), refusing an engine
    of a kind that generates which does not implement the generation
    contract: the model fails to load, naming what is wrong, rather than a
    request finding a member missing."""

    def __init__(self, build: BuildsEngines) -> None:
        self._build = build

    async def __call__(self, spec: ModelSpec, registry: Registry) -> Engine:
        engine = await self._build(spec, registry)
        kind = registry.kind_of(spec)
        if kind.generates and not isinstance(engine, GenerationEngine):
            with contextlib.suppress(Exception):
                await engine.close()
            raise ModelLoadFailed(
                f"Model `{spec.name}` is a {kind.name} model but its engine ({type(engine).__name__}) does not "
                "implement mlxd.engine.contract.GenerationEngine"
            )
        return engine


class PrefixCacheHooks:
    """The daemon's lifecycle hooks: save a model's prefix cache before it
    unloads (idle, eviction, admin, reload or shutdown), then keep the whole
    ``<cache_dir>/prefix`` within the sum of the models' disk bounds.

    The save's MLX part runs on the worker and its file I/O in a thread, one
    entry at a time: the event loop and other models keep going meanwhile.
    """

    def __init__(self) -> None:
        self._bound = CacheDirBound()

    async def before_unload(self, spec: ModelSpec, engine: Engine, reason: str, registry: Registry) -> None:
        saved = await engine.before_unload()
        if saved is None:
            return
        total = sum(
            m.prefix_cache.disk_max_bytes for m in registry.models if m.prefix_cache.persist
        )
        try:
            await asyncio.to_thread(self._bound.enforce, saved.root, total, saved.fingerprint)
        except OSError as exc:
            log.warning("bounding the prefix cache dir %s failed: %s", saved.root, exc)
