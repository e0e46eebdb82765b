"""The OpenAI-compatible surface: chat, completions, models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxd.api.openai.bodies import ChatCompletionRequest, CompletionRequest
from mlxd.api.context import DaemonContext
from mlxd.api.generation import complete, open_stream, plan_chat, plan_completion
from mlxd.errors import ClientDisconnected


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


def router() -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        ctx = _ctx(request)
        plan = plan_chat(ctx, body)
        return await _answer(ctx, plan, request)

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        ctx = _ctx(request)
        plan = plan_completion(ctx, body)
        return await _answer(ctx, plan, request)

    @api.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        ctx = _ctx(request)
        created = int(ctx.started_at)
        data = []
        for spec in ctx.registry.models:
            view = ctx.manager.view(spec.name)
            state = view.state.value if view else "unloaded"
            for name in spec.names():
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": created,
                        "owned_by": "mlxd",
                        "root": spec.name,
                        "kind": spec.kind,
                        "state": state,
                    }
                )
        return {"object": "list", "data": data}

    return api


async def _answer(ctx: DaemonContext, plan: Any, request: Request) -> Any:
    try:
        if plan.stream:
            return await open_stream(ctx, plan, request)
        return JSONResponse(await complete(ctx, plan, request))
    except ClientDisconnected:
        # Nobody is listening; the status is for the access log.
        return Response(status_code=499)

