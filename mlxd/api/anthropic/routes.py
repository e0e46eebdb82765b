"""The Anthropic Messages surface: /v1/messages and /v1/messages/count_tokens.

``anthropic-version`` and ``anthropic-beta`` headers and Claude Code's
``?beta=true`` are accepted and need nothing: the answer does not depend on
them. Keys come as ``x-api-key`` or ``Authorization: Bearer`` (api/auth.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mlxd.api.anthropic.answers import AnthropicFrames, message
from mlxd.api.anthropic.bodies import CountTokensRequest, MessagesRequest
from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.generation import respond
from mlxd.api.plan import Entry, check_chat, plan_chat, resolve_entry
from mlxd.api.prefill import settled
from mlxd.api.reasoning import merged_template_kwargs
from mlxd.caller import Caller
from mlxd.errors import BadRequest
from mlxd.registry.model import ModelSpec
from mlxd.tools.output_plan import plan_output

PREFIX = "/v1/messages"


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


def _counting_model(ctx: DaemonContext, name: str, caller: Caller) -> ModelSpec:
    """The model whose tokenizer counts for ``name``: a failover entry's
    first local target. A remote model's tokenizer is on its backend."""
    entry = resolve_entry(ctx, name, caller)
    local = next((m for m in entry.models if ctx.registry.kind_of(m).token_counter is not None), None)
    if local is None and entry.spec.is_remote:
        raise BadRequest(
            f"count_tokens counts with a local model's tokenizer; `{name}` is served by "
            f"backend `{entry.spec.backend}`.",
            param="model",
        )
    if local is None:
        raise BadRequest(f"`{name}` counts no prompt tokens.", param="model")
    return local


def router() -> APIRouter:
    api = APIRouter()

    @api.post(PREFIX)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        ctx = _ctx(request)
        plan = plan_chat(ctx, body.requested(), body.conversation(), kind="messages", id_prefix="msg_",
                         caller=caller_of(request), call_id_prefix="toolu_")
        return await respond(
            ctx, plan, request,
            framer=lambda: AnthropicFrames(plan),
            body=lambda answer: message(plan, answer),
        )

    @api.post(f"{PREFIX}/count_tokens")
    async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
        ctx = _ctx(request)
        spec = _counting_model(ctx, body.model, caller_of(request))
        conversation, output = body.conversation(), body.output()
        pending = check_chat(Entry(spec, kinds=(ctx.registry.kind_of(spec),)), body.model, conversation, output)
        # Read and decoded as for an answer (the decoded size sets an image's
        # vision tokens), under the same bound on decoded image memory.
        images = []
        if pending is not None and pending.sources:
            await pending.read()
            images = await pending.decode(ctx.image_memory)
        # The tools as the answer's prompt would have them (none for tool_choice
        # `none`), refused as the answer would be on a model with no tool-call format.
        kind = ctx.registry.kind_of(spec)
        tool_format = await ctx.token_counter.tool_format(spec, kind) if output.tools else None
        tools = plan_output(body.model, tool_format, output).tools
        # Counted as the answer's prompt is rendered, a prefill's too.
        end = body.prompt_end()
        kwargs = merged_template_kwargs(spec, settled(end, body.reasoning(), output))
        count = await ctx.token_counter.count(spec, kind, conversation.template_messages(), tools, images, kwargs,
                                              end=end)
        return {"input_tokens": count}

    return api
