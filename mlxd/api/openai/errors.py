"""The one place where errors become OpenAI error bodies and HTTP responses.

Every response body has OpenAI's error shape, in a JSON answer and in a
stream's error frame alike. Internal failures are logged with their
traceback and answered with a generic 500: nothing internal reaches a client.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxd.errors import MlxdError
from mlxd.registry.loader import key_path

log = logging.getLogger("mlxd.http")

INTERNAL = {"error": {"message": "Internal error during generation", "type": "server_error",
                      "param": None, "code": "internal_error"}}


def error_body(exc: BaseException) -> dict[str, Any]:
    """OpenAI's error object for ``exc``; nothing of an unexpected one."""
    if isinstance(exc, MlxdError):
        return exc.body()
    return INTERNAL


def error_response(exc: MlxdError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=exc.headers())


def _field_path(loc: tuple[object, ...]) -> str:
    # FastAPI puts where the value came from first: not part of the field's name.
    return key_path(tuple(p for p in loc if p not in ("body", "query", "path"))) or ""


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(MlxdError)
    async def _mlxd_error(request: Request, exc: MlxdError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        param = _field_path(tuple(first.get("loc", ())))
        if first.get("type") == "json_invalid":
            message = "The request body is not valid JSON"
        else:
            message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        body = {"error": {"message": message, "type": "invalid_request_error", "param": param or None,
                          "code": "invalid_value"}}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        message = exc.detail if isinstance(exc.detail, str) else "Request failed"
        if exc.status_code == 404:
            message = f"No route for {request.method} {request.url.path}"
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = {"error": {"message": "Internal server error", "type": "server_error", "param": None,
                          "code": "internal_error"}}
        return JSONResponse(body, status_code=500)
