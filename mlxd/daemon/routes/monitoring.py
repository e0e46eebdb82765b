"""Health, status and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from mlxd.daemon.status import health_document, status_document


def router() -> APIRouter:
    api = APIRouter()

    @api.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        return health_document(request.app.state.ctx)

    @api.get("/v1/status")
    async def status(request: Request) -> dict[str, Any]:
        return status_document(request.app.state.ctx)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(request.app.state.ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return api
