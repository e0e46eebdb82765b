"""Pure: embedding and rerank answers of a backend (OpenAI's /embeddings,
Cohere's /rerank) read into vectors and scores, checked on the way: what a
backend sends is never trusted to have the right shape."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from mlxd.errors import BackendFailed
from mlxd.remote.refusals import broken


def read_embeddings(answer: Any, inputs: int, backend: str) -> tuple[list[np.ndarray], int]:
    """``answer`` (asked with ``encoding_format: base64``) -> one float32
    vector per input in input order, and the prompt tokens it counted."""
    try:
        data = sorted(answer["data"], key=lambda d: int(d["index"]))
        vectors = [_vector(d["embedding"]) for d in data]
        tokens = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
    except (TypeError, KeyError, ValueError, AttributeError, binascii.Error):
        raise _unreadable(backend) from None
    if len(vectors) != inputs or len({len(v) for v in vectors}) > 1:
        raise broken(backend, f"sent {len(vectors)} embeddings for {inputs} inputs")
    return vectors, tokens


def _vector(value: Any) -> np.ndarray:
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) for x in value):
        raise ValueError("an embedding is neither base64 nor a list of numbers")
    return np.asarray(value, dtype=np.float32)


def read_rerank(answer: Any, documents: int, backend: str) -> tuple[list[tuple[int, float]], int]:
    """``answer`` -> (document index, relevance score) best first, and its tokens."""
    try:
        results = [(int(r["index"]), float(r["relevance_score"])) for r in answer["results"]]
        usage = answer.get("usage") or {}
        tokens = int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0)
    except (TypeError, KeyError, ValueError, AttributeError):
        raise _unreadable(backend) from None
    if any(not 0 <= i < documents for i, _ in results):
        raise broken(backend, "ranked a document it was not sent")
    return sorted(results, key=lambda r: (-r[1], r[0])), tokens


def _unreadable(backend: str) -> BackendFailed:
    return broken(backend, "sent an answer that could not be read")
