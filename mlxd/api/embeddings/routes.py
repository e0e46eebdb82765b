"""/v1/embeddings (OpenAI), /v1/rerank, /rerank and /v2/rerank
(Cohere/Jina), Ollama's /api/embed and /api/embeddings: each a body parsed,
the one path (``path.py``), an answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from mlxd.api.context import DaemonContext
from mlxd.api.embeddings import answers, path
from mlxd.api.embeddings.bodies import EmbeddingsBody, OllamaEmbedBody, OllamaEmbeddingsBody, RerankBody
from mlxd.api.embeddings.paths import EMBEDDINGS, OLLAMA_EMBED, OLLAMA_EMBEDDINGS, RERANK_PATHS


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


class _AnyContentType(APIRoute):
    """A route whose body is JSON whatever its Content-Type says, as Ollama
    reads its own: Ollama's docs (and ours) post with ``curl -d``, which says
    ``application/x-www-form-urlencoded``, and FastAPI parses JSON only under
    a JSON type, so those requests were refused as "not a JSON object"."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def as_json(request: Request) -> Response:
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
            return await handler(Request(scope, request.receive))

        return as_json


def router() -> APIRouter:
    api = APIRouter()

    @api.post(EMBEDDINGS)
    async def embeddings(body: EmbeddingsBody, request: Request) -> Response:
        done = await path.embed(_ctx(request), request, body.model, body.inputs(), dimensions=body.dimensions)
        return answers.openai_embeddings(done, body.encoding_format)

    async def rerank(body: RerankBody, request: Request) -> Response:
        ask = body.ask()
        done = await path.rerank(_ctx(request), request, body.model, ask)
        return answers.rerank_answer(done, ask)

    for route in RERANK_PATHS:
        api.add_api_route(route, rerank, methods=["POST"])

    async def ollama_embed(body: OllamaEmbedBody, request: Request) -> Response:
        started = time.monotonic()
        done = await path.embed(_ctx(request), request, body.model, body.inputs(), dimensions=body.dimensions,
                                truncate=body.truncate)
        return answers.ollama_embed(done, started)

    async def ollama_embeddings(body: OllamaEmbeddingsBody, request: Request) -> Response:
        done = await path.embed(_ctx(request), request, body.model, body.inputs())
        return answers.ollama_embedding(done)

    for route, endpoint in ((OLLAMA_EMBED, ollama_embed), (OLLAMA_EMBEDDINGS, ollama_embeddings)):
        api.add_api_route(route, endpoint, methods=["POST"], route_class_override=_AnyContentType)

    return api
