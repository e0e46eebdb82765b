"""The engine of a remote entry: the Engine contract over HTTP.

``generate`` sends the request in OpenAI form (always streaming, so that the
first-byte and idle timeouts mean the same for every surface) to the entry's
backend and turns what comes back into engine chunks. Every API surface
works on a remote entry because none of them sees the difference.

It holds no memory of its own: residency charges it nothing and "loading"
it only builds this object.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.errors import BackendFailed, BackendTimeout, BackendUnavailable, MlxdError
from mlxd.registry.model import ModelSpec
from mlxd.remote.backends import BackendLink, BackendPool
from mlxd.remote.wire import StreamReader, endpoint, request_body, upstream_error, whole_answer

# Long enough to read an upstream error body, short enough not to hang on one.
ERROR_BODY_TIMEOUT_S = 5.0
RETRY_UNREACHABLE_S = 5.0


class RemoteEngine:
    kind = "remote"
    # Streams wait for this engine's first chunk before answering 200: a
    # backend that is down or says no is then a real HTTP status.
    confirms_start = True
    measured_bytes = 0

    def __init__(self, spec: ModelSpec, pool: BackendPool) -> None:
        assert spec.backend is not None
        self.name = spec.name
        self.backend = spec.backend
        self.remote_model = spec.remote_model or spec.name
        self._pool = pool
        self._ids = itertools.count()
        # Open upstream answers, so that abort_all can cut them.
        self._open: dict[int, aiohttp.ClientResponse | None] = {}
        self._aborted: set[int] = set()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        link = self._pool.link(self.backend)
        key = next(self._ids)
        self._open[key] = None
        link.stats.in_flight += 1
        link.stats.requests += 1
        try:
            async for chunk in self._exchange(link, request, key):
                yield chunk
        except MlxdError as exc:
            if key in self._aborted:
                yield GenerationChunk(text="", finish_reason="abort")
                return
            self._pool.failed(self.backend, exc)
            raise
        finally:
            link.stats.in_flight -= 1
            response = self._open.pop(key, None)
            self._aborted.discard(key)
            if response is not None:
                # A finished answer's connection goes back to the pool; an
                # unfinished one's is closed, which is what tells the
                # backend to stop.
                response.release()

    async def _exchange(self, link: BackendLink, request: GenerationRequest, key: int) -> AsyncIterator[GenerationChunk]:
        spec = link.spec
        loop = asyncio.get_running_loop()
        first_byte_at = loop.time() + spec.first_byte_timeout_s
        where = f"backend `{spec.name}` ({spec.url})"
        try:
            async with asyncio.timeout_at(first_byte_at):
                response = await link.client.post(
                    spec.url + endpoint(request),
                    json=request_body(request, self.remote_model),
                    headers=link.headers(self._pool.environ),
                    timeout=link.timeout(),
                )
        # A connect timeout is also a TimeoutError: it is caught first, as
        # the backend being unreachable rather than slow to answer.
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise BackendUnavailable(
                f"Cannot reach {where}: {_reason(exc)}", retry_after=RETRY_UNREACHABLE_S
            ) from None
        except TimeoutError:
            raise BackendTimeout(f"No answer from {where} within {spec.first_byte_timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise BackendFailed(f"The request to {where} failed: {_reason(exc)}", retry_after=RETRY_UNREACHABLE_S) from None
        self._open[key] = response
        if response.status >= 400:
            try:
                async with asyncio.timeout(ERROR_BODY_TIMEOUT_S):
                    body = await response.read()
            except (TimeoutError, aiohttp.ClientError):
                body = b""
            raise upstream_error(spec.name, response.status, body, response.headers.get("retry-after"))
        # Accepted: the front may answer 200 now.
        yield GenerationChunk(text="")
        if response.headers.get("content-type", "").startswith("application/json"):
            # A server that answers a stream request with the whole message.
            try:
                async with asyncio.timeout_at(first_byte_at):
                    body = await response.read()
            except TimeoutError:
                raise BackendTimeout(f"{where} sent no output within {spec.first_byte_timeout_s:g} s") from None
            except aiohttp.ClientError as exc:
                raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}") from None
            for chunk in whole_answer(body):
                yield chunk
            return
        reader = StreamReader()
        started = False
        try:
            async with asyncio.timeout_at(first_byte_at) as deadline:
                async for data in response.content.iter_any():
                    chunk = reader.feed(data)
                    if chunk is not None:
                        if not started:
                            started = True
                            watchdog = _Watchdog(loop, deadline, spec.idle_timeout_s)
                        yield chunk
                    if started:
                        watchdog.progress()
                    if reader.done:
                        break
        except TimeoutError:
            phase = "sent nothing for" if started else "sent no output within"
            limit = spec.idle_timeout_s if started else spec.first_byte_timeout_s
            raise BackendTimeout(f"{where} {phase} {limit:g} s") from None
        except aiohttp.ClientError as exc:
            raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}") from None
        finally:
            if started:
                watchdog.stop()
        yield reader.finish()

    async def abort_all(self, reason: str) -> int:
        keys = list(self._open)
        self._aborted.update(keys)
        for key in keys:
            response = self._open.get(key)
            if response is not None:
                response.close()
        return len(keys)

    async def before_unload(self) -> None:
        return None  # nothing local outlives a remote entry

    async def close(self) -> None:
        return None  # the pool owns the connections

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, "remote_model": self.remote_model, "in_flight": len(self._open)}


class _Watchdog:
    """The idle timeout once output has started: the longest silence allowed
    between two reads. Progress is a time stamp; one timer, re-armed only
    when it fires, checks it and expires ``deadline`` (which then cancels
    the read) once the silence is long enough. Rescheduling the deadline at
    every read would cost a timer per token."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: asyncio.Timeout, idle_s: float) -> None:
        self._loop = loop
        self._deadline = deadline
        self._idle = idle_s
        self._last = loop.time()
        deadline.reschedule(None)  # the first-byte limit is met: only silence counts now
        self._timer: asyncio.TimerHandle | None = loop.call_at(self._last + idle_s, self._check)

    def progress(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        silent_until = self._last + self._idle
        if self._loop.time() >= silent_until:
            self._timer = None
            self._deadline.reschedule(self._loop.time())  # expire now
        else:
            self._timer = self._loop.call_at(silent_until, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text[:200] or type(exc).__name__
