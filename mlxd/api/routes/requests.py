"""The requests under way: list them, cancel one by its ``X-Request-Id``
or its response object's id (the seed's ``POST /v1/requests/{id}/cancel``
and ``DELETE /v1/requests/{id}``). An admin key cancels any request; any
other key only its own."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.errors import RequestNotFound, clip


def router() -> APIRouter:
    api = APIRouter()

    @api.get("/v1/caller")
    async def who(request: Request) -> dict[str, Any]:
        """Who this key is: the dashboard shows actions to admin keys only."""
        caller = caller_of(request)
        return {"key": caller.name, "admin": caller.admin}

    @api.get("/v1/requests")
    async def in_flight(request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        caller = caller_of(request)
        entries = [e for e in ctx.inflight.entries() if caller.admin or e.caller == caller.name]
        return {"object": "list", "data": [e.as_dict() for e in entries]}

    async def cancel(request_id: str, request: Request) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        caller = caller_of(request)
        entry = ctx.inflight.find(request_id, lambda e: caller.admin or e.caller == caller.name)
        if entry is None:
            # Another key's request is as unknown to this one as a finished one.
            raise RequestNotFound(f"No request under way has the id `{clip(request_id)}`")
        entry.cancel()
        return {"object": "request.cancel", "id": request_id, "cancelled": True, "model": entry.model}

    api.add_api_route("/v1/requests/{request_id}/cancel", cancel, methods=["POST"])
    api.add_api_route("/v1/requests/{request_id}", cancel, methods=["DELETE"])
    return api
