"""``GET /v1/activity``: the activity log's rows, newest first, filtered
(``model``, ``key``, ``surface``, ``request_id``, ``errors=true``) or, with
``after=ID``, the rows since that one (``mlxd log -f`` follows with it). An
admin key reads every row; another key only its own."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request

from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext


def router() -> APIRouter:
    api = APIRouter()

    @api.get("/v1/activity")
    async def activity(
        request: Request,
        limit: int = Query(100, ge=1, le=1000),
        after: int | None = Query(None, ge=0),
        model: str | None = None,
        key: str | None = None,
        surface: str | None = None,
        request_id: str | None = None,
        errors: bool = False,
    ) -> dict[str, Any]:
        ctx: DaemonContext = request.app.state.ctx
        log = ctx.activity
        if log is None:
            return {"object": "list", "data": [], "path": None}
        caller = caller_of(request)
        if not caller.admin:
            key = caller.name
        rows = await asyncio.to_thread(
            log.query, limit=limit, after=after, errors_only=errors,
            model=model, key=key, surface=surface, request_id=request_id,
        )
        return {"object": "list", "data": rows, "path": str(log.path), "problem": log.failed}

    return api
