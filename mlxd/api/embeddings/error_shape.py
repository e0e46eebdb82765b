"""Ollama's error bodies, ``{"error": "message"}``, for its /api/* routes."""

from __future__ import annotations

from typing import Any

from mlxd.api.error_responses import Invalid
from mlxd.errors import MlxdError


class OllamaErrors:
    """The Ollama surface's ErrorShape (mlxd.api.error_responses)."""

    def body(self, exc: BaseException) -> dict[str, Any]:
        if isinstance(exc, MlxdError):
            return {"error": exc.message}
        return {"error": "internal error"}

    def invalid(self, problem: Invalid) -> dict[str, Any]:
        return {"error": problem.message}

    def http(self, status: int, message: str) -> dict[str, Any]:
        return {"error": message}
