"""The one place where errors become HTTP responses, for every surface.

What happens is shared: a typed error keeps its status and headers, a body
that does not validate is a 400 naming the field (as OpenAI and Anthropic
answer it, not FastAPI's 422), an unknown route a 404,
and an unexpected failure is logged with its traceback and answered with a
generic 500 (nothing internal reaches a client). What the body looks like is
the surface's: each has one ``ErrorShape`` (``api/openai/error_shape.py``), picked
by the request's path.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mlxd.api.request_ids import id_headers, request_id_of
from mlxd.errors import MlxdError
from mlxd.registry.document import key_path

log = logging.getLogger("mlxd.http")


@dataclass(frozen=True)
class Invalid:
    """What is wrong with a request body that does not validate."""

    message: str
    # Where: the dotted path of the first bad field (``messages[0].role``),
    # None for the body as a whole.
    param: str | None
    # "json" (not JSON at all), "missing" (a required field), "type" (a value
    # of the wrong type) or "value" (the right type, a value out of range).
    kind: str


class ErrorShape(Protocol):
    """One surface's error bodies."""

    def body(self, exc: BaseException) -> dict[str, Any]:
        """A typed error's body; for anything else, a generic internal error."""
        ...

    def invalid(self, problem: Invalid) -> dict[str, Any]:
        """A request body that does not validate (answered with a 400)."""
        ...

    def http(self, status: int, message: str) -> dict[str, Any]:
        """Routing and server-level failures (no such route, 500)."""
        ...


@dataclass(frozen=True)
class FieldNames:
    """What a surface calls the fields that the shared request path checks
    under chat's names (``max_tokens``, ``response_format``, ``messages``):
    the surface's one mapping, applied where its errors become bodies, so an
    error names the field its client sent, whichever layer raised it (the
    plan, the output plan, the grammar compiler)."""

    # chat's name -> the surface's; a param is renamed when it is the name or
    # starts with it and a ".".
    names: Mapping[str, str] = field(default_factory=dict)

    def renamed(self, exc: MlxdError) -> MlxdError:
        """``exc`` with its param, and that field's name in its message, in
        this surface's terms (``exc`` itself when it names no mapped field)."""
        param = exc.param or ""
        found = next((k for k in self.names if param == k or param.startswith(k + ".")), None)
        if found is None:
            return exc
        out = copy.copy(exc)
        out.param = self.names[found] + param[len(found):]
        # The field's name as a word of the message, not inside a longer name.
        out.message = re.sub(rf"(?<![\w.]){re.escape(found)}(?![\w])", self.names[found], exc.message)
        out.args = (out.message,)
        return out


# The shape for a request path: each surface answers in its own.
ShapeFor = Callable[[str], ErrorShape]


def error_response(shape: ErrorShape, exc: MlxdError) -> JSONResponse:
    return JSONResponse(shape.body(exc), status_code=exc.status_code, headers=exc.headers())


# Types pydantic names in a location when a value matched no member of a union.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "bytes", "none", "any"})


def _union_member(part: object) -> bool:
    """Whether ``part`` of a location names the union member pydantic tried
    (``str``, ``list[str]``, ``ChatMessage``) rather than a field: request
    fields are snake_case, never bracketed or capitalised."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_NAMES or part[:1].isupper())


def _field_path(loc: Sequence[object]) -> str:
    # FastAPI puts where the value came from first: not part of the field's
    # name (a field may itself be called ``query``, as rerank's is).
    if loc and loc[0] in ("body", "query", "path"):
        loc = loc[1:]
    return key_path(tuple(p for p in loc if not _union_member(p))) or ""


def invalid_body(errors: Sequence[Any]) -> Invalid:
    """The first problem pydantic found, named by its field. A value that
    matched no member of a union is one problem: the member it got furthest
    into names it (``prompt[1]`` for a list with one bad item), and members
    that all failed at the top say so together."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "value_error"}
    if first.get("type") == "json_invalid":
        return Invalid("The request body is not valid JSON", None, "json")
    if tuple(first.get("loc", ())) == ("body",):
        # The whole body, not a field of it: form-encoded or plain text (no
        # JSON content type), a JSON array, or nothing; pydantic's own words
        # ("a valid dictionary or object to extract fields from") said none of it.
        empty = first.get("type") == "missing"
        return Invalid(f"The request body {'is empty' if empty else 'is not a JSON object'}: send a JSON object "
                       "with Content-Type: application/json", None, "missing" if empty else "type")
    said = [first]
    loc = tuple(first.get("loc", ()))
    tag = next((i for i, part in enumerate(loc) if _union_member(part)), None)
    if tag is not None:
        members = [e for e in errors if _same_union(tuple(e.get("loc", ())), loc[:tag])]
        deepest = max(len(e["loc"]) for e in members)
        said = [e for e in members if len(e["loc"]) == deepest]
    param = _field_path(tuple(said[0].get("loc", ())))
    kinds = {_kind(str(e.get("type", ""))) for e in said}
    kind = kinds.pop() if len(kinds) == 1 else "type"
    message = " or ".join(dict.fromkeys(str(e.get("msg")) for e in said))
    return Invalid(f"{param}: {message}" if param else message, param or None, kind)


def _same_union(loc: tuple[object, ...], prefix: tuple[object, ...]) -> bool:
    return len(loc) > len(prefix) and loc[: len(prefix)] == prefix and _union_member(loc[len(prefix)])


def _kind(pydantic_type: str) -> str:
    if pydantic_type == "missing":
        return "missing"
    if pydantic_type.endswith(("_type", "_parsing")):
        return "type"
    return "value"


def install_error_handlers(app: FastAPI, shape_for: ShapeFor) -> None:
    @app.exception_handler(MlxdError)
    async def _mlxd_error(request: Request, exc: MlxdError) -> JSONResponse:
        return error_response(shape_for(request.url.path), exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problem = invalid_body(exc.errors())
        return JSONResponse(shape_for(request.url.path).invalid(problem), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "Request failed"
        if exc.status_code == 404:
            message = f"No route for {request.method} {request.url.path}"
        body = shape_for(request.url.path).http(exc.status_code, message)
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The request id finds its activity row ("internal error") and its request log line. This
        # answer leaves outside RequestIds (Starlette's outermost middleware sends it): it names it itself.
        request_id = request_id_of(request.scope)
        log.exception("unhandled error on %s %s (request_id=%s)", request.method, request.url.path, request_id)
        return JSONResponse(shape_for(request.url.path).http(500, "Internal server error"), status_code=500,
                            headers=id_headers(request_id))
