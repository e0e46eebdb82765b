"""Operator actions: load and unload a model now, reload models.yaml."""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from mlxd.api.context import DaemonContext
from mlxd.errors import BadRequest, ConfigError, ServiceUnavailable, UnsupportedMediaType
from mlxd.registry.model import FailoverSpec, ModelSpec


class ConfigReloader(Protocol):
    """Hot reload of models.yaml (``mlxd.daemon.reload.Reloader``)."""

    async def reload(self, trigger: str) -> dict[str, Any]: ...
    async def start_watching(self) -> None: ...
    async def stop_watching(self) -> None: ...


def require_json(request: Request) -> None:
    """A browser can send a cross-site form or text/plain POST without asking
    first; one with a JSON body it must preflight, and mlxd answers no
    preflight. So admin actions take JSON only."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType(
            "Admin requests must be sent with 'Content-Type: application/json' (an empty body or {} will do)"
        )


def _model(ctx: DaemonContext, name: str) -> ModelSpec:
    failover = ctx.registry.find(name)
    if isinstance(failover, FailoverSpec):
        raise BadRequest(
            f"`{name}` is a failover entry over {', '.join(failover.targets)}: load or unload one of its targets"
        )
    return ctx.manager.resolve(name)


def router(reloader: ConfigReloader | None) -> APIRouter:
    api = APIRouter(dependencies=[Depends(require_json)])

    @api.post("/v1/models/{name}/load")
    async def load(name: str, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        spec = _model(ctx, name)
        await ctx.manager.load(spec.name)
        view = ctx.manager.view(spec.name)
        return {"model": spec.name, "state": view.state.value if view else "removed"}

    @api.post("/v1/models/{name}/unload")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        spec = _model(ctx, name)
        state = await ctx.manager.unload(spec.name)
        return {"model": spec.name, "state": state}

    @api.post("/v1/admin/reload", response_model=None)
    async def reload(request: Request) -> dict[str, Any] | JSONResponse:
        if reloader is None:
            raise ServiceUnavailable("This mlxd was started without a registry file to reload")
        try:
            return await reloader.reload("api")
        except ConfigError as exc:
            return config_error_response(exc)

    return api


def config_error_response(exc: ConfigError) -> JSONResponse:
    """OpenAI's error body, whose message is the one-line ``file:line: key:
    msg``, plus the same location as separate fields for programs."""
    body = exc.body()
    body["error"].update(file=exc.file, line=exc.line, key=exc.key, detail=exc.detail)
    return JSONResponse(body, status_code=exc.status_code)
