"""Typed errors. Each knows its HTTP status and OpenAI error shape.

Every layer raises these; exactly one place (``mlxd.api.error_responses``) turns them
into HTTP responses, and the CLI turns ``ConfigError`` into exit status 2.
Messages are written for the client: they never carry a stack trace or an
internal exception's text unless it was sanitized first.
"""

from __future__ import annotations

import math
from typing import Any


class MlxdError(Exception):
    status_code: int = 500
    error_type: str = "server_error"
    code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(MlxdError):
    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class NotForThisModel(BadRequest):
    """The request is well formed but the model it reached cannot give what
    it asks (tools on a model without a tool-call format, a prompt past its
    context, log-probabilities from a backend). A failover entry's next
    target may; anywhere else it is the client's 400, like any BadRequest."""

    @classmethod
    def of(cls, error: BadRequest) -> NotForThisModel:
        return cls(error.message, param=error.param, code=error.code, retry_after=error.retry_after)


class ContextTooLong(NotForThisModel):
    """A prompt longer than the model's context (another target's may be
    longer). ``prompt_tokens`` is None where the prompt was refused by its
    length in characters, before it was tokenized."""

    code = "context_length_exceeded"

    # (Defaults: copy.copy remakes an exception from its message alone, then its fields.)
    def __init__(self, message: str, *, param: str | None = None, prompt_tokens: int | None = None,
                 limit: int = 0) -> None:
        super().__init__(message, param=param)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class AuthenticationFailed(MlxdError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(MlxdError):
    status_code = 403
    error_type = "invalid_request_error"
    code = "forbidden"


class ModelNotFound(MlxdError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"

    def __init__(self, requested: str, available: list[str]) -> None:
        names = ", ".join(f"`{n}`" for n in sorted(available)) or "none"
        super().__init__(
            f"The model `{clip(requested)}` does not exist. Available models: {names}",
            param="model",
        )
        self.requested = requested


class BodyTimeout(MlxdError):
    status_code = 408
    error_type = "invalid_request_error"
    code = "request_body_timeout"


class PayloadTooLarge(MlxdError):
    status_code = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class HeadersTooLarge(MlxdError):
    status_code = 431
    error_type = "invalid_request_error"
    code = "request_headers_too_large"


class UnsupportedMediaType(MlxdError):
    status_code = 415
    error_type = "invalid_request_error"
    code = "unsupported_media_type"


class QueueFull(MlxdError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "queue_full"


class RateLimited(MlxdError):
    """An app's own limit (``rpm``, ``tpm``, ``tokens_per_day``,
    ``max_concurrency``): Retry-After and the ``x-ratelimit-*`` headers say
    when and how much."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float, limit_headers: dict[str, str]) -> None:
        super().__init__(message, retry_after=retry_after)
        self.limit_headers = limit_headers

    def headers(self) -> dict[str, str]:
        return {**self.limit_headers, **super().headers()}


class ServiceUnavailable(MlxdError):
    """The request is valid but cannot be served now; retry later."""

    status_code = 503
    error_type = "server_error"
    code = "unavailable"


class ModelLoadFailed(ServiceUnavailable):
    code = "model_load_failed"


class ModelFailed(ServiceUnavailable):
    """A resident model broke under its requests (a parallel model's rank
    exited or stopped making progress); it loads again after a backoff."""

    code = "model_failed"


class CapacityUnavailable(ServiceUnavailable):
    code = "insufficient_memory"


class ShuttingDown(ServiceUnavailable):
    code = "shutting_down"


class ModelPreempted(ServiceUnavailable):
    code = "preempted"


class ModelUnloaded(ServiceUnavailable):
    """The engine was unloaded under a request that had its lease (an admin
    unload or a shutdown raced it); the next attempt loads it again."""

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` was unloaded; retry the request.")


class RequestTimeout(MlxdError):
    status_code = 504
    error_type = "timeout_error"
    code = "timeout"


class BackendUnavailable(ServiceUnavailable):
    """A remote backend cannot be reached or refuses connections."""

    code = "backend_unavailable"


class BackendFailed(MlxdError):
    """A remote backend answered with a server error, broke the protocol or
    died mid-answer."""

    status_code = 502
    error_type = "server_error"
    code = "bad_gateway"

    def __init__(self, message: str, *, detail: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        # The backend's own words (a server error's message): for the log,
        # never for the client.
        self.detail = detail


class BackendTimeout(RequestTimeout):
    """A remote backend sent no first output, or went silent mid-stream, for
    longer than its ``timeouts``."""

    code = "backend_timeout"


class UpstreamRejected(MlxdError):
    """A remote backend turned the request down (a 4xx): its status and
    message are passed through to the client."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code or "upstream_error", retry_after=retry_after)
        self.status_code = status_code
        self.error_type = error_type


class ClientDisconnected(MlxdError):
    """Not sent to anyone (the client is gone); logged and counted as 499."""

    status_code = 499
    error_type = "client_closed_request"
    code = "client_closed_request"


class RequestCancelled(MlxdError):
    """An operator (or the request's own key) cancelled it by id before it
    had an answer. Not a code an SDK retries (OpenAI's retry 409)."""

    status_code = 499
    error_type = "invalid_request_error"
    code = "request_cancelled"


class RequestNotFound(MlxdError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "request_not_found"


class ResponseNotFound(MlxdError):
    """No stored response of this id for this caller (never stored, evicted,
    deleted, or another app's): OpenAI's 404 for GET and DELETE."""

    status_code = 404
    error_type = "invalid_request_error"
    code = "response_not_found"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


class StartupError(MlxdError):
    """The daemon cannot start here (port taken, state dir unusable): the CLI
    prints one line and exits 2, before any model work has run."""


class ConfigError(MlxdError):
    """A registry or settings problem, located as precisely as we can.

    ``str()`` gives the one-line form ``file:line: key: message`` that the CLI
    prints and ``/v1/status`` shows.
    """

    status_code = 400
    error_type = "invalid_request_error"
    code = "invalid_config"

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        key: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.detail = message
        super().__init__(self._render(message))

    def _render(self, message: str) -> str:
        where = ""
        if self.file:
            where = self.file if self.line is None else f"{self.file}:{self.line}"
        parts = [p for p in (where, self.key) if p]
        return ": ".join([*parts, message])

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.detail}


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """One safe line for logs, /v1/status and client messages: the exception's
    type and first line, control characters escaped, length bounded."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)
    # Our own errors are written for people: their class name only repeated
    # what the sentence says ("ModelLoadFailed: The model `x` could not be loaded").
    ours = isinstance(exc, MlxdError) and text
    line = text if ours else f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


class GGUFError(ConfigError):
    """A GGUF file mlxd cannot convert: corrupt, or an architecture, tensor
    type or tokenizer it does not know. A ConfigError, so a registry entry
    pointing at such a file is reported at its ``path`` key."""

    code = "invalid_gguf"


def clip(text: str, limit: int = 80) -> str:
    """A client-supplied string bounded for echoing in a message: a request
    must not be able to make its error (or the log line) megabytes long."""
    text = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."
