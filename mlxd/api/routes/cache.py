"""The seed's cache routes, per model: ``GET /v1/cache/stats`` (every
model's prefix cache), ``DELETE /v1/cache/prefix`` (every model's, or
``?model=NAME``'s) and ``DELETE /v1/cache`` (prefix caches and MLX's free
buffers). Clearing is for admin keys. The shapes are vllm-mlx's, whose
``engine_cache`` here sums the models' figures."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from mlxd.api.auth import caller_of, require_admin
from mlxd.api.context import DaemonContext
from mlxd.api.plan import check_model
from mlxd.caller import ANONYMOUS, Caller
from mlxd.engine import memory
from mlxd.engine.kinds import named_function
from mlxd.errors import ModelNotFound
from mlxd.residency.shell import ModelView

# Figures that add up across models.
SUMMED = ("memory_entries", "memory_bytes", "max_bytes", "hits", "misses", "tokens_reused")


def _views(ctx: DaemonContext, model: str | None, caller: Caller = ANONYMOUS) -> list[ModelView]:
    """Every model's view, or ``model``'s; only those ``caller`` may use (an
    app's key reads its own models' caches, as its status shows them)."""
    views = [v for v in ctx.manager.snapshot().models if caller.may_use(*v.spec.names())]
    if model is None:
        return views
    spec = ctx.registry.lookup(model)
    if spec is not None:
        check_model(caller, model, spec.names())
    chosen = [v for v in views if spec is not None and v.name == spec.name]
    if not chosen:
        raise ModelNotFound(model, [v.name for v in views])
    return chosen


def cache_stats(views: list[ModelView]) -> dict[str, Any]:
    models = [
        {"model": v.name, "state": v.state.value, "engine_cache": v.engine.get("prefix_cache")} for v in views
    ]
    caches = [m["engine_cache"] for m in models if m["engine_cache"]]
    total = {key: sum(c.get(key) or 0 for c in caches) for key in SUMMED} if caches else None
    return {
        "object": "cache.stats",
        "engine_cache": total,
        "models": models,
        # The seed's vision caches: mlxd keeps none of them.
        "multimodal_kv_cache": None,
        "pixel_values_cache": None,
        "pil_image_cache": None,
    }


async def _clear_prefix(ctx: DaemonContext, views: list[ModelView]) -> list[dict[str, str]]:
    """Each model's prefix cache, in memory and on disk. A model not in
    memory may still have a saved copy that its next load would restore."""
    out = []
    for view in views:
        # Cleared mid-unload, the save would write the cache back to disk
        # (and mid-load, the restore bring it back to memory): wait for it.
        await ctx.manager.settled(view.name)
        engine = ctx.manager.engine(view.name)
        if engine is not None:
            status = "cleared" if await engine.clear_prefix_cache() else "not_supported"
        elif (kind := ctx.registry.kind_of(view.spec)).prefix_cache:
            saved = await named_function(kind.clears_saved)(view.spec, ctx.registry.manager.cache_dir)
            status = "cleared" if saved else "no_engine"
        else:
            status = "no_engine"
        out.append({"model": view.name, "status": status})
    return out


def _overall(results: list[dict[str, str]]) -> str:
    statuses = {r["status"] for r in results}
    if "cleared" in statuses:
        return "cleared"
    return "not_supported" if "not_supported" in statuses else "no_engine"


def router() -> APIRouter:
    api = APIRouter()

    @api.get("/v1/cache/stats")
    async def stats(request: Request, model: str | None = None) -> dict[str, Any]:
        return cache_stats(_views(request.app.state.ctx, model, caller_of(request)))

    @api.delete("/v1/cache/prefix", dependencies=[Depends(require_admin)])
    async def clear_prefix(request: Request, model: str | None = None) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        results = await _clear_prefix(ctx, _views(ctx, model))
        # mlxd warms nothing on its own, so nothing is scheduled again.
        return {"status": _overall(results), "rewarm_scheduled": False, "models": results}

    @api.delete("/v1/cache", dependencies=[Depends(require_admin)])
    async def clear_all(request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        results = await _clear_prefix(ctx, _views(ctx, None))
        released = await ctx.worker.call(memory.release_memory)
        return {
            "status": "cleared",
            "engine_cache": {"models": results, "mlx_memory": released["after"]},
            "caches": ["prefix", "mlx_buffers"],
        }

    return api
