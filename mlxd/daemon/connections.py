"""uvicorn's httptools protocol with two bounds it lacks: how many
connections are open at once, and how long a client may take to send its
request headers.

Without them, sockets that connect and then send nothing (or half a request
line) stay open forever and each holds a file descriptor: a few hundred of
them exhaust the daemon's. Slow *bodies* are bounded by
``mlxd.api.guards`` (the app reads the body through it); idle keep-alive
connections by uvicorn's own ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mlxd.errors import ServiceUnavailable


def _refusal_bytes() -> bytes:
    error = ServiceUnavailable("Too many open connections; retry shortly", code="too_many_connections", retry_after=1)
    body = json.dumps(error.body()).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"retry-after: 1\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def bounded_protocol(max_connections: int, header_timeout_s: float) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with these bounds."""
    refusal = _refusal_bytes()

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _refused = False
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                # Answer and close at once: the file descriptor is back at
                # the kernel before this connection ever counts.
                self._refused = True
                self.transport = transport
                transport.write(refusal)
                transport.close()
                return
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._cancel_header_timer()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            # The next request on a kept-alive connection: its headers get
            # the same time as the first one's.
            self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._cancel_header_timer()
            super().on_headers_complete()

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedHttpToolsProtocol
