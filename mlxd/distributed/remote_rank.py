"""A rank on another machine, started by the mlxd running there (a backend
of ``kind: mlxd``, authenticated by its key): no ssh. The same handle as a
local rank (``distributed/processes.py``), over that mlxd's gang routes
(``api/routes/gang.py``): reserve an address, start with the whole host
list, commands in, the rank's event lines out as one long NDJSON stream.
The hosting mlxd ends its rank when that stream's reader goes away, so a
daemon that dies leaves no rank behind on other machines either."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from typing import Any

import httpx

# Not the backend's request timeouts: the event stream is idle for as long
# as the model is (liveness is the gang's own business), and a start waits
# for nothing but a spawn.
TIMEOUT = httpx.Timeout(30.0, read=None)


class RemoteRank:
    def __init__(self, client: httpx.AsyncClient, rank_id: str, address: str, label: str) -> None:
        self._client = client
        self.id = rank_id
        self.address = address
        self.label = label
        self.pid: int | None = None
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._stream: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        self._last_words = ""

    @classmethod
    async def reserve(cls, url: str, key: str | None, body: dict[str, Any], label: str) -> RemoteRank:
        """Ask the backend for a rank's address (``url`` is its OpenAI root,
        ending in /v1)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        client = httpx.AsyncClient(base_url=url, headers=headers, timeout=TIMEOUT)
        try:
            answer = await client.post("/gang/ranks", json=body)
            answer.raise_for_status()
            got = answer.json()
            return cls(client, str(got["id"]), str(got["address"]), label)
        except BaseException:
            await client.aclose()
            raise

    async def start(self, hosts: list[list[str]], jaccl: dict[str, Any] | None = None) -> None:
        """Start it with every rank's address (and, over jaccl, the
        coordinator's and the RDMA device names)."""
        answer = await self._client.post(f"/gang/ranks/{self.id}/start", json={"hosts": hosts, **(jaccl or {})})
        answer.raise_for_status()
        self.pid = int(answer.json()["pid"])
        self._stream = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        code = -1
        try:
            async with self._client.stream("GET", f"/gang/ranks/{self.id}/events") as answer:
                answer.raise_for_status()
                async for line in answer.aiter_lines():
                    message = _exit_of(line)
                    if message is not None:
                        code = int(message.get("code", -1))
                        self._last_words = str(message.get("stderr") or "")
                        break
                    self._lines.put_nowait(line.encode() + b"\n")
        except (httpx.HTTPError, ValueError) as exc:
            self._last_words = f"lost contact with its host ({type(exc).__name__})"
        finally:
            self._lines.put_nowait(b"")
            if not self._exit.done():
                self._exit.set_result(code)

    @property
    def exited(self) -> bool:
        return self._exit.done()

    async def readline(self) -> bytes:
        return await self._lines.get()

    async def send(self, data: bytes) -> None:
        async with self._send_lock:  # commands keep their order
            with contextlib.suppress(httpx.HTTPError):
                await self._client.post(f"/gang/ranks/{self.id}/commands", content=data)

    def close_input(self) -> None:
        return None

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: signal.Signals) -> None:
        if self.exited:
            return
        asyncio.ensure_future(self._signal(sig))

    async def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"/gang/ranks/{self.id}/signal", json={"signal": sig.name})

    def last_words(self) -> str:
        return self._last_words

    async def aclose(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            with contextlib.suppress(BaseException):
                await self._stream
        else:
            # Reserved, never started (a peer's reservation failed): give it back.
            with contextlib.suppress(httpx.HTTPError):
                await self._client.delete(f"/gang/ranks/{self.id}")
        await self._client.aclose()


def _exit_of(line: str) -> dict[str, Any] | None:
    if '"ev":"exit"' not in line.replace(" ", ""):
        return None
    with contextlib.suppress(ValueError):
        message = json.loads(line)
        if isinstance(message, dict) and message.get("ev") == "exit" and "rank" not in message:
            return message
    return None
