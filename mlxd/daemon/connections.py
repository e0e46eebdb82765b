"""uvicorn's httptools protocol with the bounds it lacks: how many
connections are open at once (and from one peer), how long a client may
take to send its request headers, how long a request that announced a
body may wait before its first byte, and how long a client may take none
of its answer.

Without them, sockets that connect and then send nothing (or half a request
line) stay open forever and each holds a file descriptor: a few hundred of
them exhaust the daemon's. A request's headers are bounded in size too:
the parser keeps them all, so a client writing header lines as fast as
loopback carries them grew the daemon's memory by hundreds of megabytes a
second, each connection as much, within the header time. A body that
trickles is bounded by ``mlxd.api.guards`` (the app reads the body through
it); idle keep-alive connections by uvicorn's own ``timeout_keep_alive``. A body that never
starts is closed after the header time: a few hundred such clients would
otherwise hold every connection for the whole body timeout.

One peer may hold half the connections, so a single client cannot take
them all; a few more are kept for loopback ``GET /health`` alone, so a
local service manager's check still answers while the bound is reached.

A client that stops reading (its socket open, the kernel's buffers full)
pauses the transport's writes, and the request's next send waits for it:
its stream held its batch row, its place among the requests under way and
its connection for as long as it stayed. Writes paused for
``send_timeout_s`` (read live: a reload changes it) with none of the
buffered answer taken in that time close the connection,
unsent bytes dropped; the app sees a disconnect, as for a client that
went away, and ends the request with a 499. Closed here rather than by
timing out the app's send: uvicorn then knows the client is gone, and
logs no "returned without completing response" error of its own.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import logging
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mlxd.errors import HeadersTooLarge, MlxdError, ServiceUnavailable
from mlxd.registry.sizing import format_bytes

log = logging.getLogger("mlxd.requests")

# The most a request line and its headers may take: well above any real
# client's (large cookies and bearer tokens included), as nginx's and Node's.
MAX_HEAD_BYTES = 64 * 1024

# macOS's getsockopt for the bytes in a socket's send buffer (<sys/socket.h>).
SO_NWRITE = 0x1024


def unsent_bytes(transport: Any) -> int:
    """Bytes of the answer the client has not taken: the transport's
    buffer and the kernel's send queue. The kernel's counts: a socket
    reports room to write only once a good part of its (megabytes of) send
    buffer is free, so a slow reader empties that first, for many seconds,
    while the transport's buffer stands still."""
    queued = 0
    sock = transport.get_extra_info("socket")
    try:
        if sock is not None and sys.platform == "darwin":
            queued = sock.getsockopt(socket.SOL_SOCKET, SO_NWRITE)
        elif sock is not None and sys.platform.startswith("linux"):
            import fcntl
            import termios

            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except OSError:
        pass  # closed meanwhile: the transport's figure alone
    return transport.get_write_buffer_size() + queued


def _answer_bytes(error: MlxdError, status: str) -> bytes:
    body = json.dumps(error.body()).encode()
    extra = "".join(f"{name.lower()}: {value}\r\n" for name, value in error.headers().items())
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"{extra}connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _refusal_bytes() -> bytes:
    error = ServiceUnavailable("Too many open connections; retry shortly", code="too_many_connections", retry_after=1)
    return _answer_bytes(error, "503 Service Unavailable")


def _too_large_bytes() -> bytes:
    error = HeadersTooLarge(f"The request line and headers are larger than {format_bytes(MAX_HEAD_BYTES)}.")
    return _answer_bytes(error, "431 Request Header Fields Too Large")


# Connections past the bound kept for loopback health checks.
HEALTH_ROOM = 4


def _peer_of(transport: Any) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


def _is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == ""  # a Unix socket: only local processes reach it
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def _declares_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def bounded_protocol(
    max_connections: int, header_timeout_s: float, send_timeout_s: Callable[[], float],
    closed: Callable[[str], None] = lambda reason: None,
) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with these bounds;
    ``send_timeout_s`` gives the live send bound, ``closed`` is told why
    each connection these bounds close was closed (``/metrics``): an
    operator whose clients report dropped connections sees which bound did
    it, not only a log line."""
    refusal = _refusal_bytes()
    too_large = _too_large_bytes()
    per_peer = max(1, max_connections // 2)
    # Open connections per peer address, for this server's connections only.
    by_peer: collections.Counter[str] = collections.Counter()
    health_room = [HEALTH_ROOM]  # left of it now

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _refused = False
        # Admitted into the health room: serves GET /health only.
        _health_only = False
        _refused_late = False
        _peer = ""
        _header_timer: asyncio.TimerHandle | None = None
        # Between a request's first byte and its last header, and how many
        # bytes of it have come so far.
        _in_head = True
        _head_bytes = 0
        # Armed while the transport's writes are paused (the client reads nothing).
        _stall_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            peer = _peer_of(transport)
            if len(self.connections) >= max_connections or by_peer[peer] >= per_peer:
                if _is_loopback(peer) and health_room[0] > 0:
                    self._health_only = True
                    health_room[0] -= 1
                else:
                    self._refuse(transport)
                    return
            self._peer = peer
            by_peer[peer] += 1
            super().connection_made(transport)
            self._arm_header_timer()

        def _refuse(self, transport: Any) -> None:
            # Answer and close at once: the file descriptor is back at the
            # kernel before this connection ever counts.
            closed("connection_limit")
            self._refused = True
            self.transport = transport
            transport.write(refusal)
            transport.close()

        def data_received(self, data: bytes) -> None:
            if self._refused or self._refused_late:
                return
            was_in_head = self._in_head
            super().data_received(data)
            # Only a read that began and ended inside the headers counts
            # whole (one that also holds a body's bytes must not be refused).
            if was_in_head and self._in_head and not self._refused_late:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    closed("headers_too_large")
                    self._refuse_late(too_large)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._cancel_header_timer()
            # (uvicorn resumes its own flow control here, not through resume_writing.)
            self._cancel_stall_timer()
            if self._health_only:
                health_room[0] += 1
            by_peer[self._peer] -= 1
            if by_peer[self._peer] <= 0:
                del by_peer[self._peer]
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0
            # The next request on a kept-alive connection: its headers get
            # the same time as the first one's.
            self._arm_header_timer()

        def on_headers_complete(self) -> None:
            self._cancel_header_timer()
            self._in_head = False
            if self._health_only and (self.url.split(b"?", 1)[0] != b"/health" or _declares_body(self.headers)):
                closed("connection_limit")
                self._refuse_late(refusal)
                return
            super().on_headers_complete()
            if _declares_body(self.headers):
                # Cancelled by its first byte (the body's own deadline is
                # the guard's from there).
                self._header_timer = self.loop.call_later(header_timeout_s, self._too_slow)

        def on_body(self, body: bytes) -> None:
            self._cancel_header_timer()
            if not self._refused_late:  # (no request cycle was made)
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._cancel_header_timer()
            if not self._refused_late:
                super().on_message_complete()

        def _refuse_late(self, answer: bytes) -> None:
            # No request cycle is made for it: the answer goes out and the
            # connection closes, the rest of what the client sends unread.
            self._refused_late = True
            self.transport.write(answer)
            self.transport.close()

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(header_timeout_s, self._too_slow)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stall_timer is None:
                self._watch_stall()

        def resume_writing(self) -> None:
            self._cancel_stall_timer()
            super().resume_writing()

        def answering(self) -> bool:
            """A request on this connection has begun and its answer is not all written."""
            return self.cycle is not None and not self.cycle.response_complete

        def cut(self) -> None:
            """Close now, unsent bytes dropped: the app sees a disconnect."""
            self.transport.abort()

        def _cancel_stall_timer(self) -> None:
            if self._stall_timer is not None:
                self._stall_timer.cancel()
                self._stall_timer = None

        def _watch_stall(self) -> None:
            bound = send_timeout_s()
            self._stall_timer = self.loop.call_later(bound, self._stalled, bound, unsent_bytes(self.transport))

        def _stalled(self, bound: float, unsent: int) -> None:
            self._stall_timer = None
            if unsent_bytes(self.transport) < unsent:
                # The client took some of it: a slow reader, not a stalled
                # one. Writes stay paused until it has taken most of what is
                # buffered, which at a slow link's pace (a large JSON body, a
                # speech file) takes longer than the bound.
                self._watch_stall()
                return
            scope = getattr(self, "scope", None) or {}
            log.warning("%s %s: the client read none of its answer for %g s (server.send_timeout_s); "
                        "connection closed", scope.get("method", "-"), scope.get("path", "-"), bound)
            # Not close(): that waits for the unsent bytes, which this client never takes.
            closed("stalled")
            self.cut()

        def _too_slow(self) -> None:
            # Headers, or an announced body's first byte, not in time.
            self._header_timer = None
            if not self.transport.is_closing():
                closed("header_timeout")
                self.transport.close()

    return BoundedHttpToolsProtocol
