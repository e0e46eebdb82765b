"""OpenAI's error bodies: ``{"error": {"message", "type", "param", "code"}}``,
in a JSON answer and in a stream's error frame alike. The typed errors of
``mlxd.errors`` carry their OpenAI type and code themselves."""

from __future__ import annotations

from typing import Any

from mlxd.api.error_responses import FieldNames, Invalid
from mlxd.errors import MlxdError

INTERNAL = {"error": {"message": "Internal error during generation", "type": "server_error",
                      "param": None, "code": "internal_error"}}


def error_body(exc: BaseException) -> dict[str, Any]:
    """OpenAI's error object for ``exc``; nothing of an unexpected one."""
    if isinstance(exc, MlxdError):
        return exc.body()
    return INTERNAL


# OpenAI's codes for a body that does not validate (a body that is not JSON has none).
INVALID_CODES = {"missing": "missing_required_parameter", "type": "invalid_type", "value": "invalid_value"}


class OpenAIErrors:
    """The OpenAI surface's ErrorShape (mlxd.api.error_responses), for chat,
    completions and the Responses API alike; ``fields`` is how the path's API
    names the shared fields (the Responses API's ``max_output_tokens``)."""

    def __init__(self, fields: FieldNames | None = None) -> None:
        self.fields = fields or FieldNames()

    def body(self, exc: BaseException) -> dict[str, Any]:
        return error_body(self.fields.renamed(exc) if isinstance(exc, MlxdError) else exc)

    def invalid(self, problem: Invalid) -> dict[str, Any]:
        return {"error": {"message": problem.message, "type": "invalid_request_error", "param": problem.param,
                          "code": INVALID_CODES.get(problem.kind)}}

    def http(self, status: int, message: str) -> dict[str, Any]:
        if status >= 500:
            return {"error": {"message": message, "type": "server_error", "param": None, "code": "internal_error"}}
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}
