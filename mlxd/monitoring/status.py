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
from collections.abc import Callable
from functools import cache
from typing import Any

import psutil

from mlxd import __version__
from mlxd.monitoring.snapshot import DaemonSnapshot
from mlxd.failover.router import FailoverView
from mlxd.remote.backends import BackendView
from mlxd.residency.core import State
from mlxd.registry.sizing import format_bytes
from mlxd.residency.shell import ModelView

SCHEMA_VERSION = 1
EVENTS_LIMIT = 100

# The prefix cache's figures, as an engine reports them under
# ``stats()["prefix_cache"]``; absent ones are null.
PREFIX_CACHE_FIELDS = (
    "memory_entries",
    "memory_bytes",
    "checkpoint_entries",
    "checkpoint_bytes",
    "disk_entries",
    "disk_bytes",
    "hits",
    "misses",
    "tokens_reused",
    "next_turn_prefills",
    "next_turn_tokens",
    "restored_entries",
    "recompute_entries",
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
    from mlxd.engine.cuda_attention import CUDNN_SDPA_ENV
    from mlxd.engine.kernel_cache import PTX_ENV
    from mlxd.registry.device import current_device

    try:
        found = current_device().as_dict()
    except Exception:  # status must answer even if MLX is unhappy
        found = {"kind": None, "name": None, "memory_bytes": None, "memory_source": None, "ram_bytes": None}
    return {**found, "kernel_cache": os.environ.get(PTX_ENV),
            "cudnn_attention": os.environ.get(CUDNN_SDPA_ENV, "1") != "0"}


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


def _warmup(engine_stats: dict[str, Any]) -> dict[str, Any]:
    reported = engine_stats.get("warmup")
    return reported if isinstance(reported, dict) else {}


def prefix_cache_status(engine_stats: dict[str, Any]) -> dict[str, Any]:
    reported = engine_stats.get("prefix_cache")
    if not isinstance(reported, dict):
        reported = {}
    return {key: reported.get(key) for key in PREFIX_CACHE_FIELDS}


SPECULATIVE_FIGURES = ("acceptance_rate", "accepted_per_step", "speedup")
# Counts since the model loaded: what a rate does not say (how many verify
# steps an auto-off that stays off still spends on its probes).
SPECULATIVE_COUNTS = ("verify_steps", "drafted_tokens", "accepted_tokens")


def speculative_status(m: ModelView) -> dict[str, Any] | None:
    """``speculative:`` under the model: its settings, and while it is loaded
    the engine's figures (null before it has any; ``active`` false unloaded)."""
    configured = m.spec.speculative
    if configured is None:
        return None
    reported = m.engine.get("speculative")
    if not isinstance(reported, dict):
        reported = {}
    out: dict[str, Any] = {"method": configured.method, "tokens": configured.tokens}
    out.update({key: reported.get(key) for key in (*SPECULATIVE_FIGURES, *SPECULATIVE_COUNTS)})
    out["active"] = bool(reported.get("active"))
    out["draft_model"] = configured.draft_model
    out["unsupported"] = reported.get("unsupported")
    return out


def model_status(snap: DaemonSnapshot, m: ModelView) -> dict[str, Any]:
    spec = m.spec
    return {
        "name": m.name,
        "aliases": list(spec.aliases),
        "kind": spec.kind,
        "path": str(spec.path),
        "description": spec.description,
        "state": m.state.value,
        "drain_reason": m.drain_reason,
        "pinned": spec.pinned,
        "preload": spec.preload,
        "active_leases": m.active,
        "queued": m.queued,
        "max_concurrency": spec.max_concurrency,
        "max_queue": spec.max_queue,
        "loaded_at": m.loaded_at,
        "last_used_at": m.last_used_at,
        "idle_unload_seconds": spec.idle_unload_seconds,
        "idle_unload_at": m.idle_unload_at,
        "idle_unload_in_seconds": None if m.idle_unload_at is None else max(0.0, m.idle_unload_at - time.time()),
        "memory": {
            "estimated_bytes": spec.charge_bytes,
            "weights_bytes": spec.footprint.weights,
            "kv_cache_bytes": spec.footprint.kv_cache,
            "prefix_cache_bytes": spec.footprint.prefix_cache,
            "measured_bytes": m.measured_bytes,
            "reserved_bytes": m.reserved,
        },
        "load_count": m.load_count,
        "last_load_seconds": m.last_load_seconds,
        "last_unload": None if m.last_unload is None else {
            "at": m.last_unload.at, "cause": m.last_unload.cause, "reason": m.last_unload.reason},
        "failures": m.failures,
        "last_error": m.last_error,
        "retry_at": m.retry_at,
        "requests": m.requests,
        "tokens_in": m.tokens_in,
        "tokens_out": m.tokens_out,
        "recent_output_tokens": snap.recent_tokens.get(m.name, 0),
        "recent_tokens_per_second": round(snap.recent_rate(m.name), 3),
        "recent_busy_seconds": round(snap.recent_busy.get(m.name, 0.0), 3),
        "busy_tokens_per_second": round(snap.busy_rate(m.name), 3),
        "warmup_seconds": _warmup(m.engine).get("seconds"),
        "prefill_tokens_per_s": _warmup(m.engine).get("prefill_tokens_per_s"),
        "warmup_mode": _warmup(m.engine).get("mode"),
        "warmup_done": _warmup(m.engine).get("done"),
        "prefix_cache": prefix_cache_status(m.engine),
        "speculative": speculative_status(m),
        "engine": m.engine,
        # A parallel model's gang (docs/distributed.md): how it is split and
        # each rank while resident; which rank failed is in last_error.
        "parallel": spec.parallel.as_dict() if spec.parallel is not None else None,
        "ranks": m.engine.get("ranks", []) if spec.parallel is not None else None,
        "backend": spec.backend,
        "remote_model": spec.remote_model,
        "implicit": spec.implicit,
    }


def failover_status(f: FailoverView) -> dict[str, Any]:
    spec = f.spec
    return {
        "name": spec.name,
        "aliases": list(spec.aliases),
        "description": spec.description,
        "strategy": spec.strategy,
        # The order a request arriving now would try the targets in.
        "order": list(f.order),
        "targets": [
            {
                "name": t.state.name,
                "kind": t.state.kind,
                "backend": t.backend,
                "remote_model": t.remote_model,
                "state": t.state.state,
                "reachable": t.state.reachable,
                "in_flight": t.state.busy,
                "queued": t.state.waiting,
                "capacity": t.state.capacity,
                "requests": t.counts.requests,
                "fell_through": t.counts.fell_through,
                "last_error": t.counts.last_error,
                "last_error_at": t.counts.last_error_at,
            }
            for t in f.targets
        ],
        "recent": [{"target": r.target, "status": r.status, "at": r.at} for r in f.recent],
    }


def backend_status(b: BackendView) -> dict[str, Any]:
    spec = b.spec
    return {
        "name": spec.name,
        "url": spec.url,
        "kind": spec.kind,
        # Whether a key is sent, never the key (nor its variable's value).
        "api_key_env": spec.api_key_env,
        "max_concurrency": spec.max_concurrency,
        "timeouts": {
            "connect": spec.connect_timeout_s,
            "first_byte": spec.first_byte_timeout_s,
            "idle": spec.idle_timeout_s,
        },
        "reachable": b.stats.reachable,
        "latency_ms": b.stats.latency_ms,
        "polled_at": b.stats.polled_at,
        "poll_error": b.stats.poll_error,
        "in_flight": b.stats.in_flight,
        "requests": b.stats.requests,
        "errors": b.stats.errors,
        "last_error": b.stats.last_error,
        # kind: mlxd: the backend's models and their states.
        "models": b.stats.models,
    }


def problems(snap: DaemonSnapshot) -> list[str]:
    """What makes the daemon degraded, for operators (names models)."""
    found = [_failed(m) for m in snap.manager.models if m.state is State.FAILED]
    found += [_too_large(m, snap.manager.budget) for m in _over_budget(snap)]
    found += [
        f"backend `{b.spec.name}` ({b.spec.url}) is not reachable: {b.stats.poll_error}"
        for b in snap.backends
        if b.stats.reachable is False
    ]
    if snap.config.error is not None:
        found.append(f"the configuration file is invalid: {snap.config.error}")
    return found


def app_problems(snap: DaemonSnapshot, may_use: Callable[[str], bool]) -> list[str]:
    """``problems`` as an app's non-admin key reads them: its own models'
    failures in full, the rest as ``health_document`` says them (no other
    model's name, no backend's address, no line of the configuration file,
    which may hold what an operator pasted by mistake)."""
    failed = [m for m in snap.manager.models if m.state is State.FAILED]
    found = [_failed(m) for m in failed if may_use(m.name)]
    too_large = _over_budget(snap)
    own_too_large = [_too_large(m, snap.manager.budget) for m in too_large if may_use(m.name)]
    return (found + own_too_large
            + _generic_reasons(snap, len(failed) - len(found), "other model(s)", len(too_large) - len(own_too_large)))


def _failed(model: ModelView) -> str:
    return f"model `{model.name}` failed to load: {model.last_error}"


def _over_budget(snap: DaemonSnapshot) -> list[ModelView]:
    """Models that need more than the whole budget, most often found by
    measuring them (an estimate that large is refused when the file is
    read): every request for one gets a 503 until an operator acts, which
    retrying cannot change."""
    budget = snap.manager.budget
    return [m for m in snap.manager.models
            if m.state is not State.FAILED and m.charge > budget]


def _too_large(model: ModelView, budget: int) -> str:
    how = "measured" if (model.measured_bytes or 0) >= model.spec.charge_bytes else "estimated"
    now = ("it is loaded now, but cannot load again once unloaded"
           if model.state in (State.LOADED, State.LOADING, State.DRAINING) else "it cannot load")
    return (f"model `{model.name}` needs {format_bytes(model.charge)} ({how}), more than the whole memory budget "
            f"of {format_bytes(budget)}: {now}; raise manager.memory_budget, or lower its max_context "
            "or max_concurrency")


def status_document(snap: DaemonSnapshot) -> dict[str, Any]:
    budget = snap.manager.budget
    committed = snap.manager.committed
    vm = psutil.virtual_memory()
    config = snap.config
    found = problems(snap)
    return {
        "schema_version": SCHEMA_VERSION,
        "generated_at": time.time(),
        "health": {"status": "degraded" if found else "ok", "problems": found},
        "daemon": {
            "version": __version__,
            "pid": os.getpid(),
            "started_at": snap.started_at,
            "uptime_seconds": time.time() - snap.started_at,
            "platform": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(),
            "mlx": _mlx_runtime(),
            "device": device_now(),
            "blas": {key: snap.blas.get(key) for key in BLAS_FIELDS},
            "bind": {"host": snap.host, "port": snap.port},
            "auth_required": snap.auth_required,
            "metrics_enabled": snap.metrics_enabled,
            "draining": snap.draining,
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
        "models": [model_status(snap, m) for m in snap.manager.models],
        "backends": [backend_status(b) for b in snap.backends],
        "failover": [failover_status(f) for f in snap.failovers],
        "usage": list(snap.usage),
        "apps": list(snap.apps),
        # Built by hand: dataclasses.asdict costs ~20 µs an event, 2 ms for a full ring.
        "events": [
            {"at": e.at, "kind": e.kind, "model": e.model, "message": e.message}
            for e in snap.events
        ],
    }


def _generic_reasons(snap: DaemonSnapshot, failed: int, models: str = "model(s)",
                     too_large: int | None = None) -> list[str]:
    """Why the daemon is degraded, in counts: no names, paths or errors."""
    reasons = []
    if failed:
        reasons.append(f"{failed} {models} failed to load")
    too_large = len(_over_budget(snap)) if too_large is None else too_large
    if too_large:
        reasons.append(f"{too_large} {models} need more than the whole memory budget")
    if snap.config.error is not None:
        reasons.append("the configuration file on disk is invalid")
    down = sum(1 for b in snap.backends if b.stats.reachable is False)
    if down:
        reasons.append(f"{down} backend(s) not reachable")
    return reasons


def health_document(snap: DaemonSnapshot) -> dict[str, Any]:
    """Open to anyone: counts and generic reasons, no names, paths or errors."""
    states = [m.state for m in snap.manager.models]
    failed = sum(1 for s in states if s is State.FAILED)
    reasons = _generic_reasons(snap, failed)
    return {
        "status": "degraded" if reasons else "ok",
        "reasons": reasons,
        "version": __version__,
        "draining": snap.draining,
        "models": {
            "registered": len(states),
            "loaded": sum(1 for s in states if s is State.LOADED),
            "failed": failed,
        },
        "blas": snap.blas.get("active"),
        "device": {key: device_now()[key] for key in ("kind", "name", "memory_bytes")},
        "mlx_active_bytes": mlx_memory_now()["active_bytes"],
    }
