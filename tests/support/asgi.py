"""Driving an ASGI app by hand: the test decides when the client sends its
body, when it goes away, and reads the response as it is written. (httpx's
ASGI transport buffers whole responses and cannot disconnect mid-stream.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any


@contextlib.asynccontextmanager
async def running(app: Any) -> AsyncIterator[None]:
    """The app's lifespan: startup before the block, shutdown after it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await asyncio.wait_for(outbox.get(), 10)
    assert started["type"] == "lifespan.startup.complete", started
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(outbox.get(), 30)
        await asyncio.wait_for(task, 30)


class Call:
    """One HTTP request in flight."""

    def __init__(self, app: Any, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
        raw = body if isinstance(body, bytes) else (b"" if body is None else json.dumps(body).encode())
        self._body = raw
        self._sent_body = False
        self._gone = asyncio.Event()
        self._started = asyncio.Event()
        self._more = asyncio.Event()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.finished = asyncio.Event()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
            "headers": [(b"content-type", b"application/json"),
                        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())],
        }
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if self._gone.is_set() and message["type"] == "http.response.body":
            return  # as uvicorn does: writes after a disconnect go nowhere
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
            self._started.set()
        elif message["type"] == "http.response.body":
            if message.get("body"):
                self.chunks.append(message["body"])
                self._more.set()
            if not message.get("more_body", False):
                self.finished.set()
                self._more.set()

    def disconnect(self) -> None:
        self._gone.set()

    async def started(self, timeout: float = 10) -> int:
        await asyncio.wait_for(self._started.wait(), timeout)
        assert self.status is not None
        return self.status

    async def text_until(self, needle: str, timeout: float = 10) -> str:
        """Everything written so far, once it contains ``needle``."""
        async def wait() -> str:
            while needle not in self.text:
                self._more.clear()
                if self.finished.is_set():
                    raise AssertionError(f"response ended without {needle!r}: {self.text!r}")
                await self._more.wait()
            return self.text

        return await asyncio.wait_for(wait(), timeout)

    async def done(self, timeout: float = 10) -> Call:
        await asyncio.wait_for(self.task, timeout)
        return self

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode()

    def json(self) -> Any:
        return json.loads(self.text)
