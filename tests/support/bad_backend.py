"""A deliberately broken OpenAI-compatible backend, for failure injection:
no real server sends a gzip bomb or a tool call at index -1 on cue. Raw
asyncio on a thread of its own, on loopback. What it does to a generation
request is picked by the request's ``model`` (a front entry's
``remote_model``); GETs (the front's polls) get a model list. Every
request is recorded, so a test can tell what reached it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

HEAD = "HTTP/1.1 {status}\r\ncontent-type: {type}\r\n{extra}connection: close\r\n"


def event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def delta(**fields: Any) -> bytes:
    return event({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]})


def finished(reason: str = "stop", usage: dict[str, Any] | None = None) -> list[bytes]:
    usage = usage or {"prompt_tokens": 5, "completion_tokens": 2}
    return [event({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}),
            event({"choices": [], "usage": usage}), b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _bomb() -> bytes:
    """64 MiB of one "data: aaa..." line with no newline, gzipped (~64 KB)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"a" * (1 << 20)
    return packer.compress(b"data: ") + b"".join(packer.compress(block) for _ in range(64)) + packer.flush()


class BadBackend:
    def __init__(self, redirect_to: str | None = None) -> None:
        self.redirect_to = redirect_to
        # (method, path, model) of every request, in order.
        self.requests: list[tuple[str, str, str]] = []
        # The JSON body of every generation request, in order.
        self.bodies: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._bomb = _bomb()
        self.url = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[BadBackend]:
        ready = threading.Event()

        async def serve() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"
            ready.set()

        thread = threading.Thread(target=self._loop.run_forever, name="bad-backend", daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(serve(), self._loop).result(timeout=10)
        ready.wait(10)
        try:
            yield self
        finally:
            async def stop() -> None:
                assert self._server is not None
                self._server.close()
                for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                    task.cancel()

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(timeout=10)

    def generations(self) -> list[str]:
        """The models of the generation requests that reached it."""
        return [model for method, _, model in self.requests if method == "POST"]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = (await reader.readline()).decode("latin-1").split()
            headers = {}
            while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            parsed = json.loads(body) if body else {}
            model = parsed.get("model", "")
            self.requests.append((line[0], line[1], model))
            if line[0] == "POST":
                self.bodies.append(parsed)
            if line[0] != "POST":
                await self._whole(writer, 200, {"object": "list", "data": [{"id": "ok", "object": "model"}]})
            else:
                await BEHAVIOURS[model](self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    # --- answers -------------------------------------------------------------

    @staticmethod
    async def _whole(writer: asyncio.StreamWriter, status: int, payload: Any, extra: str = "") -> None:
        body = json.dumps(payload).encode()
        head = HEAD.format(status=status, type="application/json", extra=extra)
        writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()

    @staticmethod
    async def _stream(writer: asyncio.StreamWriter, events: list[bytes], extra: str = "",
                      pause: float = 0.0) -> None:
        head = HEAD.format(status="200 OK", type="text/event-stream", extra=extra)
        writer.write(f"{head}transfer-encoding: chunked\r\n\r\n".encode())
        for data in events:
            writer.write(_chunk(data))
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def bomb(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Compressed although mlxd asked for identity.
        pieces = [self._bomb[i:i + 16384] for i in range(0, len(self._bomb), 16384)]
        await self._stream(writer, pieces, extra="content-encoding: gzip\r\n")

    async def huge_line(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        block = b"a" * (1 << 20)
        await self._stream(writer, [b"data: ", *[block] * 32])

    async def tool_indices(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        def call(index: int, **function: Any) -> bytes:
            return delta(tool_calls=[{"index": index, "type": "function", "function": function}])

        await self._stream(writer, [
            delta(role="assistant", content=""),
            call(3000000, name="first", arguments='{"a": '), call(3000000, arguments="1}"),
            call(-1, name="second", arguments="{}"),
            call(2, name="third", arguments="{}"),
            call(77, arguments="never named"),
            *finished("tool_calls"),
        ])

    async def negative_usage(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._stream(writer, [delta(role="assistant", content=""), delta(content="Hi"),
                                    *finished(usage={"prompt_tokens": -5, "completion_tokens": -1})])

    async def plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Nothing wrong: a short answer, for tests that read what was asked.
        await self._stream(writer, [delta(role="assistant", content=""), delta(content="Hi"), *finished()])

    async def broken_off(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Starts its answer, then hangs up mid-body (a backend that crashed).
        head = HEAD.format(status="200 OK", type="text/event-stream", extra="")
        writer.write(f"{head}transfer-encoding: chunked\r\n\r\n".encode())
        for data in (delta(role="assistant", content=""), delta(content="Half an ans")):
            writer.write(_chunk(data))
        await writer.drain()
        writer.transport.abort()

    async def silent(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = HEAD.format(status="200 OK", type="text/event-stream", extra="")
        writer.write(f"{head}transfer-encoding: chunked\r\n\r\n".encode() + _chunk(b": still here\n\n"))
        await writer.drain()
        await reader.read()  # until mlxd hangs up

    async def garbage(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._stream(writer, [b"data: <html><body>Bad Gateway</body></html>\n\n"])

    async def reasoning(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Thinks (in a field mlxd does not relay) for longer than first_byte.
        thoughts = [delta(reasoning_content="hmm ") for _ in range(12)]
        await self._stream(writer, thoughts + [delta(content="42"), *finished()], pause=0.25)

    async def redirect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        where = f"location: {self.redirect_to}/chat/completions\r\n"
        await self._whole(writer, 307, {"moved": True}, extra=where)

    async def server_error(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A 500 whose body is far larger than any error message.
        head = HEAD.format(status="500 Internal Server Error", type="text/plain", extra="")
        writer.write(f"{head}transfer-encoding: chunked\r\n\r\n".encode())
        for _ in range(200):
            writer.write(_chunk(b"CUDA out of memory at /opt/vllm/worker.py:123 " * 20000))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()


Behaviour = Callable[[BadBackend, asyncio.StreamReader, asyncio.StreamWriter], Any]
BEHAVIOURS: dict[str, Behaviour] = {
    name: getattr(BadBackend, name)
    for name in ("bomb", "huge_line", "tool_indices", "negative_usage", "plain", "broken_off", "silent", "garbage",
                 "reasoning", "redirect", "server_error")
}
