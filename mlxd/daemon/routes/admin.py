"""Operator actions: load and unload a model now."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from mlxd.daemon.context import DaemonContext


def router() -> APIRouter:
    api = APIRouter()

    @api.post("/v1/models/{name}/load")
    async def load(name: str, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        spec = ctx.manager.resolve(name)
        await ctx.manager.load(spec.name)
        return {"model": spec.name, "state": ctx.manager.core.residents[spec.name].state.value}

    @api.post("/v1/models/{name}/unload")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        spec = ctx.manager.resolve(name)
        state = await ctx.manager.unload(spec.name)
        return {"model": spec.name, "state": state}

    return api
