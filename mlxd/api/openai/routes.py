"""The OpenAI-compatible surface: chat, completions, models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.generation import respond
from mlxd.api.openai.answers import OpenAIFrames, chat_completion, text_completion
from mlxd.api.openai.bodies import ChatCompletionRequest, CompletionRequest, choices
from mlxd.api.openai.models import codex_catalog, listed_names, model_item, page
from mlxd.api.plan import plan_chat, plan_prompts, resolve_entry
from mlxd.registry.model import FailoverSpec, ModelSpec


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


def router() -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        ctx = _ctx(request)
        body.unsupported()
        plan = plan_chat(ctx, body.requested(), body.conversation(), caller=caller_of(request))
        plan.requests[0].logprobs = body.logprob_alternatives()
        choices(plan, body.n)
        return await respond(
            ctx, plan, request,
            framer=lambda: OpenAIFrames(plan, chat=True, include_usage=body.include_usage),
            body=lambda answer: chat_completion(plan, answer),
        )

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        ctx = _ctx(request)
        body.unsupported()
        plan = plan_prompts(ctx, body.requested(), body.prompts(), caller=caller_of(request))
        return await respond(
            ctx, plan, request,
            framer=lambda: OpenAIFrames(plan, chat=False, include_usage=body.include_usage),
            body=lambda answer: text_completion(plan, answer),
        )

    @api.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        ctx = _ctx(request)
        caller = caller_of(request)
        data = [
            item for entry in ctx.registry.entries()
            # An app sees the models it may use, as a request checks them.
            if caller.may_use(*entry.names())
            for item in _items(ctx, entry, listed_names(entry, ctx.registry))
        ]
        body = page(data)
        if "client_version" in request.query_params:
            # Codex reading its model_catalog_url (docs/agents.md).
            body["models"] = codex_catalog(data)
        return body

    @api.get("/v1/models/{name:path}")
    async def one_model(name: str, request: Request) -> dict[str, Any]:
        """OpenAI's and Anthropic's ``models.retrieve``: any name a request
        may use, as the list shows it."""
        ctx = _ctx(request)
        entry = resolve_entry(ctx, name, caller_of(request))
        return _items(ctx, entry.failover or entry.spec, [name])[0]

    return api


def _items(ctx: DaemonContext, entry: ModelSpec | FailoverSpec, names: list[str]) -> list[dict[str, Any]]:
    """``entry``'s model-list items under ``names``."""
    if isinstance(entry, FailoverSpec):
        # What it stands for now: the target a request would try first
        # (during a reload, the first listed may be all that is left).
        ordered = ctx.failover.order(entry)
        first = ordered[0] if ordered else (
            ctx.registry.lookup(entry.targets[0])
            or next(m for m in ctx.registry.models if m.name == entry.targets[0]))
        about = {"owned_by": "mlxd", "kind": first.kind, "targets": list(entry.targets), "strategy": entry.strategy}
    else:
        first, about = entry, {"owned_by": entry.backend or "mlxd", "kind": entry.kind}
    view = ctx.manager.view(first.name)
    state = view.state.value if view else "unloaded"
    created, output_cap = int(ctx.started_at), ctx.settings.server.max_request_tokens
    return [model_item(name, first, about, created=created, state=state, output_cap=output_cap, root=entry.name)
            for name in names]
