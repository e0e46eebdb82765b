"""The OpenAI Responses surface: /v1/responses."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.generation import respond
from mlxd.api.plan import plan_chat
from mlxd.api.responses.answers import ResponsesFrames, complete_response
from mlxd.api.responses.bodies import ResponsesRequest
from mlxd.api.responses.store import ResponseStore
from mlxd.errors import BadRequest

PATH = "/v1/responses"


def router(store: ResponseStore) -> APIRouter:
    """``store``: recent responses, for previous_response_id (this surface's
    own state, so the daemon's context need not know it)."""
    api = APIRouter()

    @api.post(PATH)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        ctx: DaemonContext = request.app.state.ctx
        earlier: tuple = ()
        if body.previous_response_id:
            found = store.get(body.previous_response_id)
            if found is None:
                raise BadRequest(
                    f"Previous response with id '{body.previous_response_id}' not found: mlxd keeps the last "
                    f"responses in memory only (not across restarts); send the full input with store: false instead.",
                    param="previous_response_id",
                )
            earlier = found
        history = body.history(earlier)
        plan = plan_chat(ctx, body.requested(), body.conversation(history), kind="responses", id_prefix="resp_",
                         caller=caller_of(request))
        return await respond(
            ctx, plan, request,
            framer=lambda: ResponsesFrames(plan, body, store, history),
            body=lambda answer: complete_response(plan, body, answer, store, history),
        )

    return api
