"""Anthropic's error bodies: ``{"type": "error", "error": {"type", "message"}}``,
the same in a JSON answer and in a stream's ``error`` event. The status code
is the typed error's own (shared by every surface); the error type follows
from it as Anthropic assigns them. An overloaded daemon (queue, capacity,
load) answers 503, which Anthropic's clients retry like their 529. A prompt
past the model's context is told in Anthropic's words, ``prompt is too
long: N tokens > M maximum``: Claude Code reads them to compact the
conversation (and the numbers for how much), and other clients to tell a
full context from any other 400."""

from __future__ import annotations

from typing import Any

from mlxd.api.error_responses import Invalid
from mlxd.errors import ContextTooLong, MlxdError

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def body_for(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def too_long(exc: ContextTooLong) -> str:
    if exc.prompt_tokens is None:
        # Refused by its length in characters, before it was tokenized.
        return f"prompt is too long: {exc.message}"
    return f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit} maximum"


def error_body(exc: BaseException) -> dict[str, Any]:
    """Anthropic's error object for ``exc``; nothing of an unexpected one."""
    if isinstance(exc, ContextTooLong):
        return body_for(exc.status_code, too_long(exc))
    if isinstance(exc, MlxdError):
        return body_for(exc.status_code, exc.message)
    return body_for(500, "Internal error during generation")


class AnthropicErrors:
    """The Anthropic surface's ErrorShape (mlxd.api.error_responses)."""

    def body(self, exc: BaseException) -> dict[str, Any]:
        return error_body(exc)

    def invalid(self, problem: Invalid) -> dict[str, Any]:
        return body_for(400, problem.message)

    def http(self, status: int, message: str) -> dict[str, Any]:
        return body_for(status, message)
