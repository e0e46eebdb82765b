"""Typed errors for what a remote backend did wrong, as pure functions: an
upstream error answer, a redirect, an error event mid-stream, a broken
protocol. Clients see the backend's registry name and a plain reason; what
the backend itself said about a server error goes to ``detail``, for the
log."""

from __future__ import annotations

import json
from typing import Any

from mlxd.errors import BackendFailed, MlxdError, UpstreamRejected, clip

# An error answer's body is read this far for its message; the rest is
# discarded with the connection.
MAX_ERROR_BODY_BYTES = 64 * 1024
# Garbage is as retryable as a 5xx: the backend may be mid-restart.
RETRY_BROKEN_S = 5.0


def broken(backend: str, what: str, *, detail: str | None = None) -> BackendFailed:
    """A backend that broke the protocol: a 502 with Retry-After, naming the
    backend only by its registry name."""
    return BackendFailed(f"{_who(backend)} {what}", retry_after=RETRY_BROKEN_S, detail=detail)


def _who(backend: str) -> str:
    return f"Backend `{backend}`" if backend else "The backend"


def _error_fields(payload: Any) -> dict[str, str]:
    """An error body's message, type, param and code: strings only (another
    server's objects are not this API's fields)."""
    if not isinstance(payload, dict):
        return {}
    error = payload.get("error")
    if isinstance(error, dict):
        return {k: error[k] for k in ("message", "type", "param", "code") if isinstance(error.get(k), str)}
    if isinstance(error, str):
        return {"message": error}
    detail = payload.get("detail")
    if isinstance(detail, str):
        return {"message": detail}
    if isinstance(detail, list):  # FastAPI's validation errors
        texts = [d["msg"] for d in detail if isinstance(d, dict) and isinstance(d.get("msg"), str)]
        return {"message": "; ".join(texts)} if texts else {}
    return {}


def upstream_error(backend: str, status: int, body: bytes, retry_after: str | None) -> MlxdError:
    """The typed error for an upstream answer with an error status (``body``:
    as much of it as was read)."""
    try:
        fields = _error_fields(json.loads(body))
    except (ValueError, RecursionError):
        fields = {}
    message = clip(fields.get("message", "").strip(), 500)
    retry = _seconds(retry_after)
    if status in (401, 403):
        # The client's key was fine (the front checked it); the front's key
        # for the backend is not, which is the operator's to fix.
        return BackendFailed(
            f"Backend `{backend}` refused mlxd's credentials ({status}); check its api_key_env"
        )
    if 400 <= status < 500:
        return UpstreamRejected(
            status,
            message or f"Backend `{backend}` rejected the request ({status})",
            error_type=clip(fields.get("type") or "invalid_request_error", 80),
            param=clip(fields["param"], 200) if "param" in fields else None,
            code=clip(fields["code"], 80) if "code" in fields else None,
            retry_after=retry,
        )
    # A server error's own words (a path, a device) are the operator's to
    # read in the log, not the client's.
    said = message or clip(body[:200].decode("utf-8", "replace").strip(), 200)
    return BackendFailed(f"Backend `{backend}` failed ({status})", retry_after=retry or RETRY_BROKEN_S,
                         detail=said or None)


def redirected(backend: str, status: int) -> BackendFailed:
    """Redirects are not followed: the prompt goes where the registry says,
    not wherever a backend points."""
    return BackendFailed(
        f"Backend `{backend}` answered with a redirect ({status}); its `url` should point at the final address"
    )


def upstream_stream_error(payload: dict[str, Any], backend: str = "") -> BackendFailed:
    fields = _error_fields(payload)
    kind = fields.get("type") or fields.get("code")
    error = payload.get("error")
    if kind is None and isinstance(error, dict) and isinstance(error.get("code"), int):
        kind = str(error["code"])
    suffix = f" ({clip(kind, 40)})" if kind else ""
    return BackendFailed(f"{_who(backend)} failed mid-answer{suffix}", retry_after=RETRY_BROKEN_S,
                         detail=clip(fields.get("message", ""), 500) or None)


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None
