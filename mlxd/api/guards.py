"""Checks every HTTP request passes before the app sees it.

- ``Host`` must be a name this daemon answers to. A DNS-rebinding page gets
  the browser to send the attacker's own host name to 127.0.0.1; IP literals
  and loopback names cannot be rebound, anything else must be listed in
  ``server.allowed_hosts``.
- A state-changing request (POST and friends) that a browser marks with a
  foreign ``Origin`` is refused: with no API keys (the default) any page the
  user visits could otherwise unload models or reload the registry with a
  "simple" cross-site form post that needs no preflight.
- The body is bounded in size (413) and in time (408): the app reads it
  through this guard, so a client that sends headers and then a trickle
  holds its connection for ``body_timeout_s`` at most.
- (A client that stops reading its answer is cut off by the connection
  itself, after ``send_timeout_s``: ``mlxd.daemon.connections``.)

Every refusal has the error body of the API surface its path belongs to
(the app's ``ShapeFor``, the same one its error handlers use) and closes the
connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxd.api.error_responses import ErrorShape, ShapeFor
from mlxd.errors import BodyTimeout, MlxdError, PayloadTooLarge, PermissionDenied, clip
from mlxd.registry.model import ServerSpec
from mlxd.registry.sizing import format_bytes

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def host_name(host_header: str) -> str:
    """``Host`` without its port, brackets or trailing dot, lower case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_allowed(host_header: str | None, bind_host: str, allowed: tuple[str, ...]) -> bool:
    if host_header is None:
        # HTTP/1.0 clients may omit it; every browser sends one.
        return True
    if "*" in allowed:
        return True
    name = host_name(host_header)
    if _is_ip_literal(name) or name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    return name == host_name(bind_host) or name in {host_name(a) for a in allowed}


def origin_allowed(origin: str | None, host_header: str | None, allowed: tuple[str, ...]) -> bool:
    if origin is None:
        # Not a browser, or a same-origin GET-like navigation: nothing to check.
        return True
    origin = origin.strip().lower().rstrip("/")
    if "*" in allowed or origin in {a.strip().lower().rstrip("/") for a in allowed}:
        return True
    parts = urlsplit(origin)
    # Same origin: the page was served by this daemon (the dashboard).
    return parts.scheme in ("http", "https") and host_header is not None and parts.netloc == host_header.strip().lower()


class RequestGuard:
    """ASGI middleware; ``server`` gives the live server settings,
    ``shape_for`` the error body a path's surface answers in."""

    def __init__(self, app: ASGIApp, server: Callable[[], ServerSpec], shape_for: ShapeFor) -> None:
        self.app = app
        self.server = server
        self.shape_for = shape_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        server = self.server()
        headers = _headers(scope)
        host = headers.get("host")
        refusal: MlxdError | None = None
        if not host_allowed(host, server.host, server.allowed_hosts):
            refusal = PermissionDenied(
                f"Host `{clip(host or '')}` is not one this daemon answers to; add it to "
                "server.allowed_hosts in models.yaml",
                code="host_not_allowed",
            )
        elif scope["method"] in STATE_CHANGING and not origin_allowed(
            headers.get("origin"), host, server.allowed_origins
        ):
            refusal = PermissionDenied(
                f"Requests from the web page at `{clip(headers.get('origin', ''))}` are not allowed; "
                "add its origin to server.allowed_origins in models.yaml",
                code="origin_not_allowed",
            )
        elif _declared_length(headers) > server.max_body_bytes:
            refusal = _too_large(server)
        shape = self.shape_for(scope["path"])
        if refusal is not None:
            await send_error(send, refusal, shape)
            return
        body = _BoundedBody(receive, send, server, shape)
        await self.app(scope, body.receive, body.send)


class _BoundedBody:
    """The app's view of the request body: at most ``max_body_bytes``, all of
    it within ``body_timeout_s``. Past either, the guard answers itself and
    tells the app the client has gone (which it then treats as a 499)."""

    def __init__(self, receive: Receive, send: Send, server: ServerSpec, shape: ErrorShape) -> None:
        self._receive = receive
        self._shape = shape
        self._send = send
        self._limit = server.max_body_bytes
        self._timeout = server.body_timeout_s
        self._deadline = time.monotonic() + server.body_timeout_s
        self._server = server
        self._seen = 0
        self._complete = False
        self._answered = False
        self._started = False

    async def receive(self) -> Message:
        if self._answered:
            return {"type": "http.disconnect"}
        if self._complete:
            return await self._receive()
        try:
            message = await asyncio.wait_for(self._receive(), max(0.0, self._deadline - time.monotonic()))
        except asyncio.TimeoutError:
            return await self._refuse(BodyTimeout(f"The request body did not arrive within {self._timeout:g} s."))
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            if self._seen > self._limit:
                return await self._refuse(_too_large(self._server))
            self._complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self._answered:
            return  # the guard has answered already; the app's reply goes nowhere
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)

    async def _refuse(self, error: MlxdError) -> Message:
        self._answered = True
        if not self._started:
            await send_error(self._send, error, self._shape)
        return {"type": "http.disconnect"}


def _too_large(server: ServerSpec) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than {format_bytes(server.max_body_bytes)} "
        "(server.max_body_bytes in models.yaml)."
    )


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _declared_length(headers: dict[str, str]) -> int:
    value = headers.get("content-length", "")
    return int(value) if value.isdigit() else 0


async def send_error(send: Send, error: MlxdError, shape: ErrorShape) -> None:
    body = json.dumps(shape.body(error)).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The rest of a refused request may still be on its way: do not read it.
        (b"connection", b"close"),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
