"""The OpenAI Responses surface: /v1/responses."""

from __future__ import annotations

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.generation import respond
from mlxd.api.plan import plan_chat
from mlxd.api.responses.answers import ResponsesFrames, complete_response
from mlxd.api.responses.bodies import ResponsesRequest
from mlxd.api.responses.store import ResponseStore
from mlxd.errors import BadRequest, ResponseNotFound

PATH = "/v1/responses"
# Codex opens a WebSocket on the Responses path first where its provider says
# `supports_websockets` (OpenAI's own does). 426 is the answer it falls back
# to HTTP on at once; 404 or 405 cost its five reconnect attempts first
# (measured with codex 0.171.0).
NO_WEBSOCKET = {"error": {
    "message": "mlxd serves the Responses API over HTTP: POST /v1/responses (no WebSocket transport).",
    "type": "invalid_request_error", "param": None, "code": "websocket_not_supported",
}}


def router(store: ResponseStore) -> APIRouter:
    """``store``: recent responses, for previous_response_id (this surface's
    own state, so the daemon's context need not know it)."""
    api = APIRouter()

    @api.post(PATH)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        ctx: DaemonContext = request.app.state.ctx
        caller = caller_of(request)
        earlier: tuple = ()
        if body.previous_response_id:
            found = store.get(body.previous_response_id, caller.name)
            if found is None:
                # OpenAI's status and code, which clients (Codex among them) act on.
                raise BadRequest(
                    f"Previous response with id '{body.previous_response_id}' not found: mlxd keeps the last "
                    f"responses in memory only (not across restarts), each for the app or key that made it; "
                    f"send the full input with store: false instead.",
                    param="previous_response_id", code="previous_response_not_found",
                )
            earlier = found
        history = body.history(earlier)
        plan = plan_chat(ctx, body.requested(), body.conversation(history), kind="responses", id_prefix="resp_",
                         caller=caller)
        return await respond(
            ctx, plan, request,
            framer=lambda: ResponsesFrames(plan, body, store, history),
            body=lambda answer: complete_response(plan, body, answer, store, history),
        )

    @api.get(PATH + "/{response_id}")
    async def response_get(response_id: str, request: Request) -> Response:
        found = store.stored(response_id, caller_of(request).name)
        if found is None:
            raise ResponseNotFound(response_id)
        return JSONResponse(found.response)

    @api.delete(PATH + "/{response_id}")
    async def response_delete(response_id: str, request: Request) -> Response:
        if not store.delete(response_id, caller_of(request).name):
            raise ResponseNotFound(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @api.websocket(PATH)
    async def responses_websocket(websocket: WebSocket) -> None:
        await websocket.send_denial_response(JSONResponse(NO_WEBSOCKET, status_code=426))

    @api.get(PATH)
    async def responses_get() -> Response:
        # The same upgrade where the server runs without a WebSocket library.
        return JSONResponse(NO_WEBSOCKET, status_code=426)

    return api
