"""The one place where errors become HTTP responses, for every surface.

What happens is shared: a typed error keeps its status and headers, a body
that does not validate is a 422 naming the field, an unknown route a 404,
and an unexpected failure is logged with its traceback and answered with a
generic 500 (nothing internal reaches a client). What the body looks like is
the surface's: each has one ``ErrorShape`` (``api/openai/errors.py``), picked
by the request's path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxd.errors import MlxdError
from mlxd.registry.loader import key_path

log = logging.getLogger("mlxd.http")


class ErrorShape(Protocol):
    """One surface's error bodies."""

    # The status of a body that does not validate (OpenAI: 422, Anthropic: 400).
    invalid_status: int

    def body(self, exc: BaseException) -> dict[str, Any]:
        """A typed error's body; for anything else, a generic internal error."""
        ...

    def invalid(self, message: str, param: str | None) -> dict[str, Any]:
        """A request body that does not validate."""
        ...

    def http(self, status: int, message: str) -> dict[str, Any]:
        """Routing and server-level failures (no such route, 500)."""
        ...


# The shape for a request path: each surface answers in its own.
ShapeFor = Callable[[str], ErrorShape]


def error_response(shape: ErrorShape, exc: MlxdError) -> JSONResponse:
    return JSONResponse(shape.body(exc), status_code=exc.status_code, headers=exc.headers())


def _field_path(loc: tuple[object, ...]) -> str:
    # FastAPI puts where the value came from first: not part of the field's name.
    return key_path(tuple(p for p in loc if p not in ("body", "query", "path"))) or ""


def install_error_handlers(app: FastAPI, shape_for: ShapeFor) -> None:
    @app.exception_handler(MlxdError)
    async def _mlxd_error(request: Request, exc: MlxdError) -> JSONResponse:
        return error_response(shape_for(request.url.path), exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _field_path(tuple(first.get("loc", ())))
        if first.get("type") == "json_invalid":
            message = "The request body is not valid JSON"
        else:
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        shape = shape_for(request.url.path)
        return JSONResponse(shape.invalid(message, param or None), status_code=shape.invalid_status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "Request failed"
        if exc.status_code == 404:
            message = f"No route for {request.method} {request.url.path}"
        body = shape_for(request.url.path).http(exc.status_code, message)
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(shape_for(request.url.path).http(500, "Internal server error"), status_code=500)
