"""/v1/embeddings (OpenAI), /v1/rerank, /rerank and /v2/rerank
(Cohere/Jina), Ollama's /api/embed and /api/embeddings: each a body parsed,
the one path (``path.py``), an answer."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from mlxd.api.context import DaemonContext
from mlxd.api.embeddings import answers, path
from mlxd.api.embeddings.bodies import EmbeddingsBody, OllamaEmbedBody, OllamaEmbeddingsBody, RerankBody
from mlxd.api.embeddings.paths import EMBEDDINGS, OLLAMA_EMBED, OLLAMA_EMBEDDINGS, RERANK_PATHS


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


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

    @api.post(OLLAMA_EMBED)
    async def ollama_embed(body: OllamaEmbedBody, request: Request) -> Response:
        started = time.monotonic()
        done = await path.embed(_ctx(request), request, body.model, body.inputs(), dimensions=body.dimensions,
                                truncate=body.truncate)
        return answers.ollama_embed(done, started)

    @api.post(OLLAMA_EMBEDDINGS)
    async def ollama_embeddings(body: OllamaEmbeddingsBody, request: Request) -> Response:
        done = await path.embed(_ctx(request), request, body.model, body.inputs())
        return answers.ollama_embedding(done)

    return api
