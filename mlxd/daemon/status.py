"""The /v1/status document: everything an operator needs, read from state
without waiting on any model. Its schema is documented in docs/status.md."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import psutil

from mlxd import __version__
from mlxd.daemon.context import DaemonContext
from mlxd.residency.core import State

SCHEMA_VERSION = 1


def _mlx_info() -> dict[str, Any]:
    try:
        import mlx.core as mx

        from mlxd.engine.memory import mlx_memory

        return {"version": mx.__version__, "device": str(mx.default_device()), "memory": mlx_memory()}
    except Exception:  # status must answer even if MLX is unhappy
        return {"version": None, "device": None, "memory": {}}


def model_status(ctx: DaemonContext, name: str) -> dict[str, Any]:
    manager = ctx.manager
    r = manager.core.residents[name]
    spec = r.spec
    stats = manager.stats.get(name)
    engine = manager.engine(name)
    engine_stats: dict[str, Any] = {}
    if engine is not None and hasattr(engine, "stats"):
        try:
            engine_stats = engine.stats()
        except Exception:
            engine_stats = {}
    return {
        "name": name,
        "aliases": list(spec.aliases),
        "kind": spec.kind,
        "path": str(spec.path),
        "description": spec.description,
        "state": r.state.value,
        "drain_reason": r.drain_reason,
        "pinned": spec.pinned,
        "preload": spec.preload,
        "active_leases": r.active,
        "queued": manager.core.queued(name),
        "max_concurrency": spec.max_concurrency,
        "loaded_at": manager.wall_time(r.loaded_at),
        "last_used_at": manager.wall_time(r.last_used),
        "idle_unload_seconds": spec.idle_unload_seconds,
        "idle_unload_at": manager.wall_time(r.idle_deadline()),
        "memory": {
            "estimated_bytes": spec.charge_bytes,
            "weights_bytes": spec.footprint.weights,
            "kv_cache_bytes": spec.footprint.kv_cache,
            "prefix_cache_bytes": spec.footprint.prefix_cache,
            "measured_bytes": r.measured_bytes,
            "reserved_bytes": r.reserved,
        },
        "load_count": r.load_count,
        "last_load_seconds": r.last_load_seconds,
        "failures": r.failures,
        "last_error": r.last_error,
        "retry_at": manager.wall_time(r.retry_at) if r.state is State.FAILED else None,
        "requests": stats.requests if stats else 0,
        "tokens_in": stats.tokens_in if stats else 0,
        "tokens_out": stats.tokens_out if stats else 0,
        "engine": engine_stats,
    }


def status_document(ctx: DaemonContext) -> dict[str, Any]:
    manager = ctx.manager
    budget = manager.core.budget
    committed = manager.core.committed()
    vm = psutil.virtual_memory()
    config = ctx.config
    server = ctx.settings.server
    return {
        "schema_version": SCHEMA_VERSION,
        "daemon": {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": ctx.started_at,
            "uptime_seconds": time.time() - ctx.started_at,
            "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "mlx": _mlx_info(),
            "blas": ctx.blas,
            "bind": {"host": server.host, "port": server.port},
            "draining": ctx.draining,
        },
        "config": {
            "path": str(config.path) if config.path else None,
            "generation": config.generation,
            "file_hash": config.file_hash,
            "applied_at": config.applied_at,
            "last_reload": config.last_reload,
            "error": config.error.as_dict() if config.error else None,
        },
        "memory": {
            "budget_bytes": budget,
            "committed_bytes": committed,
            "free_bytes": max(0, budget - committed),
            "process_rss_bytes": psutil.Process().memory_info().rss,
            "system_total_bytes": vm.total,
            "system_available_bytes": vm.available,
        },
        "models": [model_status(ctx, name) for name in manager.core.residents],
        "events": [e.as_dict() for e in ctx.events.recent(100)],
    }


def health_document(ctx: DaemonContext) -> dict[str, Any]:
    states = [r.state for r in ctx.manager.core.residents.values()]
    failed = sum(1 for s in states if s is State.FAILED)
    return {
        "status": "degraded" if failed or ctx.config.error else "ok",
        "version": __version__,
        "draining": ctx.draining,
        "models": {
            "registered": len(states),
            "loaded": sum(1 for s in states if s is State.LOADED),
            "failed": failed,
        },
        "blas": ctx.blas.get("active"),
    }
