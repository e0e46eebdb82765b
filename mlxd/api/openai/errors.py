"""OpenAI's error bodies: ``{"error": {"message", "type", "param", "code"}}``,
in a JSON answer and in a stream's error frame alike. The typed errors of
``mlxd.errors`` carry their OpenAI type and code themselves."""

from __future__ import annotations

from typing import Any

from mlxd.errors import MlxdError

INTERNAL = {"error": {"message": "Internal error during generation", "type": "server_error",
                      "param": None, "code": "internal_error"}}


def error_body(exc: BaseException) -> dict[str, Any]:
    """OpenAI's error object for ``exc``; nothing of an unexpected one."""
    if isinstance(exc, MlxdError):
        return exc.body()
    return INTERNAL


class OpenAIErrors:
    """The OpenAI surface's ErrorShape (mlxd.api.errors)."""

    invalid_status = 422

    def body(self, exc: BaseException) -> dict[str, Any]:
        return error_body(exc)

    def invalid(self, message: str, param: str | None) -> dict[str, Any]:
        return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                          "code": "invalid_value"}}

    def http(self, status: int, message: str) -> dict[str, Any]:
        if status >= 500:
            return {"error": {"message": message, "type": "server_error", "param": None, "code": "internal_error"}}
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
