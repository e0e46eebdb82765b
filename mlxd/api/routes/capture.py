"""Capture, for admin keys only (a prompt is private): ``GET`` and ``PUT
/v1/capture`` (on for every model or some, or off), ``GET /v1/captures``
(newest first) and ``GET /v1/captures/{id}`` (by X-Request-Id or response id)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict

from mlxd.api.auth import require_admin
from mlxd.api.context import DaemonContext
from mlxd.api.routes.admin import require_json
from mlxd.errors import ModelNotFound, RequestNotFound, clip


class CaptureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool
    # None or empty: every model.
    models: list[str] | None = None


def router() -> APIRouter:
    api = APIRouter(dependencies=[Depends(require_admin)])

    @api.get("/v1/capture")
    async def settings(request: Request) -> dict[str, Any]:
        return request.app.state.ctx.captures.settings()

    @api.put("/v1/capture", dependencies=[Depends(require_json)])
    async def configure(body: CaptureSettings, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        names = []
        for name in body.models or ():
            spec = ctx.registry.lookup(name)
            if spec is None:
                raise ModelNotFound(name, ctx.registry.model_names())
            names.append(spec.name)
        return ctx.captures.configure(body.enabled, names)

    @api.get("/v1/captures")
    async def captured(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": [c.summary() for c in request.app.state.ctx.captures.entries()]}

    @api.get("/v1/captures/{request_id}")
    async def one(request_id: str, request: Request) -> dict[str, Any]:
        found = request.app.state.ctx.captures.find(request_id)
        if found is None:
            raise RequestNotFound(f"No captured request has the id `{clip(request_id)}`")
        return found.as_dict()

    return api
