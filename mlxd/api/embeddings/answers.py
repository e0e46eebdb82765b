"""The answers of the embedding and rerank routes, as JSON bytes (a
vector is written once, straight from its float32 array: each number in
the shortest form that reads back as the same float32)."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from mlxd.api.embeddings.bodies import RerankAsk
from mlxd.api.embeddings.path import Embedded, Ranked


def json_response(body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def encoded_vector(vector: np.ndarray, encoding_format: str) -> Any:
    """``float``: a JSON list; ``base64``: the little-endian float32 bytes
    (what the openai client asks for by default and decodes with numpy)."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)


def openai_embeddings(done: Embedded, encoding_format: str) -> Response:
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encoded_vector(v, encoding_format)}
                 for i, v in enumerate(done.vectors)],
        "model": done.model,
        "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens},
    })


def rerank_answer(done: Ranked, ask: RerankAsk) -> Response:
    """Cohere's and Jina's shape at once: ``results`` with ``index`` and
    ``relevance_score`` (and the document, when asked), best first."""
    results = []
    for index, score in done.results:
        result: dict[str, Any] = {"index": index, "relevance_score": score}
        if ask.return_documents:
            result["document"] = {"text": ask.documents[index]}
        results.append(result)
    return json_response({
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "rerank",
        "model": done.model,
        "results": results,
        "usage": {"prompt_tokens": done.tokens, "total_tokens": done.tokens},
        "meta": {"billed_units": {"search_units": 1}},
    })


def ollama_embed(done: Embedded, started: float) -> Response:
    return json_response({
        "model": done.model,
        "embeddings": [encoded_vector(v, "float") for v in done.vectors],
        "total_duration": int((time.monotonic() - started) * 1e9),
        "load_duration": 0,
        "prompt_eval_count": done.tokens,
    })


def ollama_embedding(done: Embedded) -> Response:
    return json_response({"embedding": encoded_vector(done.vectors[0], "float")})
