"""The /v1/status and /health documents: read from state, never waiting on a
model. The status schema is documented field by field in docs/status.md; bump
SCHEMA_VERSION when a field changes meaning or goes away (adding one does not).

Why MLX memory is read here, on the event loop, although every other MLX call
runs on the worker thread: ``get_active_memory``, ``get_peak_memory`` and
``get_cache_memory`` only read the allocator's byte counters. They take no
lock, touch no stream and cannot block (MLX's CPU, Metal and CUDA allocators
alike); measured at 0.4 µs for all three while the worker computes. A value
can be a few allocations old, which is all a status page needs.
"""

from __future__ import annotations

import os
import platform
import time
from functools import cache
from typing import Any

import psutil

from mlxd import __version__
from mlxd.daemon.context import DaemonContext
from mlxd.engine.types import Engine
from mlxd.residency.core import State

SCHEMA_VERSION = 1
EVENTS_LIMIT = 100

# The prefix cache's figures, as an engine reports them under
# ``stats()["prefix_cache"]``; absent ones are null.
PREFIX_CACHE_FIELDS = (
    "memory_entries",
    "memory_bytes",
    "disk_entries",
    "disk_bytes",
    "hits",
    "misses",
    "tokens_reused",
    "restored_entries",
    "last_save_seconds",
    "last_restore_seconds",
)
BLAS_FIELDS = ("active", "mode", "openblas_path", "ld_preload", "warning")


@cache
def _mlx_runtime() -> dict[str, str | None]:
    # Fixed for the life of the process: look it up once.
    try:
        import mlx.core as mx

        return {"version": mx.__version__, "device": str(mx.default_device())}
    except Exception:  # status must answer even if MLX is unhappy
        return {"version": None, "device": None}


@cache
def device_now() -> dict[str, Any]:
    """The device MLX runs on and what a percentage budget is a share of.
    Fixed for the life of the process: probed once."""
    from mlxd.engine.kernel_cache import PTX_ENV
    from mlxd.registry.device import current_device

    try:
        found = current_device().as_dict()
    except Exception:  # status must answer even if MLX is unhappy
        found = {"kind": None, "name": None, "memory_bytes": None, "memory_source": None, "ram_bytes": None}
    return {**found, "kernel_cache": os.environ.get(PTX_ENV)}


def mlx_memory_now() -> dict[str, int | None]:
    """MLX allocator counters in bytes; safe off the worker (module docstring)."""
    try:
        import mlx.core as mx

        return {
            "active_bytes": int(mx.get_active_memory()),
            "peak_bytes": int(mx.get_peak_memory()),
            "cache_bytes": int(mx.get_cache_memory()),
        }
    except Exception:
        return {"active_bytes": None, "peak_bytes": None, "cache_bytes": None}


def _engine_stats(engine: Engine | None) -> dict[str, Any]:
    if engine is None:
        return {}
    try:
        stats = engine.stats()
    except Exception:
        return {}
    return stats if isinstance(stats, dict) else {}


def _warmup(engine_stats: dict[str, Any]) -> dict[str, Any]:
    reported = engine_stats.get("warmup")
    return reported if isinstance(reported, dict) else {}


def prefix_cache_status(engine_stats: dict[str, Any]) -> dict[str, Any]:
    reported = engine_stats.get("prefix_cache")
    if not isinstance(reported, dict):
        reported = {}
    return {key: reported.get(key) for key in PREFIX_CACHE_FIELDS}


def model_status(ctx: DaemonContext, name: str) -> dict[str, Any]:
    manager = ctx.manager
    r = manager.core.residents[name]
    spec = r.spec
    stats = manager.stats.get(name)
    engine_stats = _engine_stats(manager.engine(name))
    idle_unload_at = manager.wall_time(r.idle_deadline())
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
        "max_queue": spec.max_queue,
        "loaded_at": manager.wall_time(r.loaded_at),
        "last_used_at": manager.wall_time(r.last_used),
        "idle_unload_seconds": spec.idle_unload_seconds,
        "idle_unload_at": idle_unload_at,
        "idle_unload_in_seconds": None if idle_unload_at is None else max(0.0, idle_unload_at - time.time()),
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
        "recent_output_tokens": ctx.metrics.throughput.tokens(name),
        "recent_tokens_per_second": round(ctx.metrics.throughput.rate(name), 3),
        "warmup_seconds": _warmup(engine_stats).get("seconds"),
        "prefill_tokens_per_s": _warmup(engine_stats).get("prefill_tokens_per_s"),
        "prefix_cache": prefix_cache_status(engine_stats),
        "engine": engine_stats,
    }


def problems(ctx: DaemonContext) -> list[str]:
    """What makes the daemon degraded, for operators (names models)."""
    found = [
        f"model `{r.name}` failed to load: {r.last_error}"
        for r in ctx.manager.core.residents.values()
        if r.state is State.FAILED
    ]
    if ctx.config.error is not None:
        found.append(f"the configuration file is invalid: {ctx.config.error}")
    return found


def status_document(ctx: DaemonContext) -> dict[str, Any]:
    manager = ctx.manager
    budget = manager.core.budget
    committed = manager.core.committed()
    vm = psutil.virtual_memory()
    config = ctx.config
    server = ctx.settings.server
    found = problems(ctx)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": time.time(),
        "health": {"status": "degraded" if found else "ok", "problems": found},
        "daemon": {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": ctx.started_at,
            "uptime_seconds": time.time() - ctx.started_at,
            "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "mlx": _mlx_runtime(),
            "device": device_now(),
            "blas": {key: ctx.blas.get(key) for key in BLAS_FIELDS},
            "bind": {"host": server.host, "port": server.port},
            "auth_required": bool(server.api_keys),
            "metrics_enabled": ctx.settings.metrics,
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
            "device_total_bytes": device_now()["memory_bytes"],
            "budget_source": device_now()["memory_source"],
            "system_total_bytes": vm.total,
            "system_available_bytes": vm.available,
            "mlx": mlx_memory_now(),
        },
        "models": [model_status(ctx, name) for name in list(manager.core.residents)],
        # Built by hand: dataclasses.asdict costs ~20 µs an event, 2 ms for a full ring.
        "events": [
            {"at": e.at, "kind": e.kind, "model": e.model, "message": e.message}
            for e in ctx.events.recent(EVENTS_LIMIT)
        ],
    }


def health_document(ctx: DaemonContext) -> dict[str, Any]:
    """Open to anyone: counts and generic reasons, no names, paths or errors."""
    states = [r.state for r in ctx.manager.core.residents.values()]
    failed = sum(1 for s in states if s is State.FAILED)
    reasons = []
    if failed:
        reasons.append(f"{failed} model(s) failed to load")
    if ctx.config.error is not None:
        reasons.append("the configuration file on disk is invalid")
    return {
        "status": "degraded" if reasons else "ok",
        "reasons": reasons,
        "version": __version__,
        "draining": ctx.draining,
        "models": {
            "registered": len(states),
            "loaded": sum(1 for s in states if s is State.LOADED),
            "failed": failed,
        },
        "blas": ctx.blas.get("active"),
        "device": {key: device_now()[key] for key in ("kind", "name", "memory_bytes")},
        "mlx_active_bytes": mlx_memory_now()["active_bytes"],
    }
