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
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp

from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    MlxdError,
    NotForThisModel,
    UpstreamRejected,
    describe_exception,
)
from mlxd.registry.model import BackendSpec, ModelSpec
from mlxd.remote.backends import BackendLink, BackendPool, read_bounded
from mlxd.remote.answer import MAX_EVENT_BYTES, StreamReader, whole_answer
from mlxd.remote.refusals import MAX_ERROR_BODY_BYTES, RETRY_BROKEN_S, broken, redirected, upstream_error
from mlxd.remote.wire import endpoint, request_body
from mlxd.tools.output_request import OutputRequest

log = logging.getLogger("mlxd.remote")

# Long enough to read an upstream error body, short enough not to hang on one.
ERROR_BODY_TIMEOUT_S = 5.0
RETRY_UNREACHABLE_S = 5.0
# A read larger than this (bytes that piled up, or a compressed burst) is
# parsed a slice at a time, letting the loop serve others in between.
READ_SLICE_BYTES = 1024 * 1024
# A backend's answer is either malformed in some way the reader did not
# foresee or a bug here: either way the client gets a 502, the log the detail.
# Embeddings come back whole: 2048 inputs of 4096 float32 values in base64 is ~45 MB.
MAX_JSON_ANSWER_BYTES = 64 << 20
# What a relayed stream's answer keeps of the backend's headers.
PASSED_HEADERS = ("x-sample-rate",)
_UNREADABLE = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError)


class RemoteEngine(GenerationEngine):
    # Streams wait for this engine's first chunk before answering 200; it
    # comes once the backend's first event has been read, so a backend that
    # is down, says no, sends garbage or nothing is a real HTTP status (and
    # lets a failover entry try its next target).
    kind = "remote"
    measured_bytes = 0
    # A request's n choices go to the backend one after the other (its own
    # batching is its business); its images go as data: URLs, decoded there.
    batching = False
    wants_image_urls = True

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

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        """The backend has the model's tool-call format, its own grammar and
        its own vocabulary (it checks a logit_bias itself): the output
        request goes to it (checked before the lease, rendered as OpenAI's
        JSON by the wire), and its tool calls and reasoning come back
        already split."""
        if output.asks_anything():
            for request in requests:
                request.output = output
        if any(r.logprobs is not None for r in requests):
            raise NotForThisModel("Log-probabilities are not relayed from a remote backend.", param="logprobs")
        return AnswerFormats()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        link = self._pool.link(self.backend)
        key = self._begin(link)
        try:
            try:
                async for chunk in self._exchange(link, request, key):
                    yield chunk
            except _UNREADABLE as exc:
                log.warning("backend %s (%s) sent an answer for %s that could not be read: %s",
                            link.spec.name, link.spec.url, self.name, describe_exception(exc))
                raise broken(link.spec.name, "sent an answer that could not be read") from None
        except MlxdError as exc:
            if key in self._aborted:
                yield GenerationChunk(text="", finish_reason="abort")
                return
            if isinstance(exc, UpstreamRejected) and exc.param and request.output is not None:
                # The backend names the field as the wire has it; the client sent it in its own body.
                exc.param = request.output.client_param(exc.param)
            self._pool.failed(self.backend, exc)
            detail = getattr(exc, "detail", None)
            log.log(logging.INFO if isinstance(exc, UpstreamRejected) else logging.WARNING,
                    "backend %s (%s), %s: %s%s", link.spec.name, link.spec.url, self.name,
                    describe_exception(exc), f" (the backend said: {detail})" if detail else "")
            raise
        finally:
            self._end(link, key)

    async def _exchange(self, link: BackendLink, request: GenerationRequest, key: int) -> AsyncIterator[GenerationChunk]:
        spec = link.spec
        loop = asyncio.get_running_loop()
        first_byte_at = loop.time() + spec.first_byte_timeout_s
        where = f"backend `{spec.name}`"  # the URL is in the log and status, not in clients' messages
        path = endpoint(request)
        headers = link.headers(self._pool.environ)
        # An event stream gains nothing from compression, and a compressed
        # answer is the cheapest way to make the front hold a lot.
        headers["Accept-Encoding"] = "identity"
        try:
            async with asyncio.timeout_at(first_byte_at):
                response = await link.client.post(
                    spec.url + path,
                    json=request_body(request, self.remote_model),
                    headers=headers,
                    timeout=link.timeout(),
                    allow_redirects=False,
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
        if response.status >= 300:
            await _refused(spec.name, response)
        if response.headers.get("content-type", "").startswith("application/json"):
            # A server that answers a stream request with the whole message.
            try:
                async with asyncio.timeout_at(first_byte_at):
                    body, cut = await read_bounded(response, MAX_EVENT_BYTES)
            except TimeoutError:
                raise BackendTimeout(f"{where} sent no output within {spec.first_byte_timeout_s:g} s") from None
            except aiohttp.ClientError as exc:
                raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}", retry_after=RETRY_BROKEN_S) from None
            if cut:
                raise broken(spec.name, f"sent an answer larger than {MAX_EVENT_BYTES // (1024 * 1024)} MiB")
            chunks = whole_answer(body, spec.name, chat=path == "/chat/completions")
            yield GenerationChunk(text="")  # accepted: the front may answer 200 now
            for chunk in chunks:
                yield chunk
            return
        reader = StreamReader(spec.name, chat=path == "/chat/completions")
        content = response.content
        # Up to the first event, first_byte bounds the wait: headers alone,
        # comments or garbage are no answer yet.
        first: GenerationChunk | None = None
        ended = False
        seen = 0
        try:
            async with asyncio.timeout_at(first_byte_at):
                while not reader.events and not ended:
                    data = await content.readany()
                    if not data:
                        ended = True
                        first = reader.close()
                        break
                    first = await _fed(reader, data)
                    seen += len(data)
                    if not reader.events and seen > MAX_EVENT_BYTES:  # lines that are no events
                        raise broken(spec.name, f"sent {MAX_EVENT_BYTES // (1024 * 1024)} MiB without an event")
        except TimeoutError:
            raise BackendTimeout(f"{where} sent no output within {spec.first_byte_timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}", retry_after=RETRY_BROKEN_S) from None
        if not reader.events:
            raise broken(spec.name, "closed the connection without sending an event")
        yield GenerationChunk(text="")  # accepted: the front may answer 200 now
        if first is not None:
            yield first
        if not reader.done and not ended:
            watchdog: _Watchdog | None = None
            try:
                async with asyncio.timeout(None) as deadline:
                    watchdog = _Watchdog(loop, deadline, spec.idle_timeout_s)
                    async for data in content.iter_any():
                        chunk = reader.feed(data) if len(data) <= READ_SLICE_BYTES else await _fed(reader, data)
                        if chunk is not None:
                            yield chunk
                        watchdog.progress()
                        if reader.done:
                            break
                    else:
                        chunk = reader.close()
                        if chunk is not None:
                            yield chunk
            except TimeoutError:
                raise BackendTimeout(f"{where} sent nothing for {spec.idle_timeout_s:g} s") from None
            except aiohttp.ClientError as exc:
                raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}", retry_after=RETRY_BROKEN_S) from None
            finally:
                if watchdog is not None:
                    watchdog.stop()
        yield reader.finish()

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """One whole JSON exchange with the backend (embeddings, rerank): the
        answer's JSON, or the typed error for a refusal, a timeout or an
        answer past ``MAX_JSON_ANSWER_BYTES``."""
        data, _ = await self.post(path, json={**body, "model": self.remote_model}, parse=json.loads)
        return data

    async def post_form(self, path: str, fields: dict[str, str | list[str]],
                        file: tuple[str, bytes]) -> tuple[bytes, str]:
        """A multipart exchange (an audio upload), the backend's model named
        in it: the answer's bytes as sent and their content type."""
        return await self.post(path, data=self.form(fields, file))

    def form(self, fields: dict[str, str | list[str]], file: tuple[str, bytes]) -> aiohttp.FormData:
        """An upload's multipart body as the backend takes it: its model's name, the fields, the file."""
        form = aiohttp.FormData()
        form.add_field("model", self.remote_model)
        for name, value in fields.items():
            for one in value if isinstance(value, list) else [value]:
                form.add_field(name, one)
        form.add_field("file", file[1], filename=file[0] or "audio")
        return form

    async def post(self, path: str, *, json: Any = None, data: Any = None,
                   parse: Any = None) -> tuple[Any, str]:
        """One whole exchange: the answer (``parse``d, when given) and its
        content type, or the typed error (also for an answer ``parse``
        cannot read, or one past ``MAX_JSON_ANSWER_BYTES``)."""
        link = self._pool.link(self.backend)
        spec = link.spec
        key = self._begin(link)
        try:
            async with asyncio.timeout(spec.first_byte_timeout_s):
                response = await self._sent(link, key, path, json=json, data=data)
                body, cut = await read_bounded(response, MAX_JSON_ANSWER_BYTES)
            if cut:
                raise broken(spec.name, f"sent an answer larger than {MAX_JSON_ANSWER_BYTES >> 20} MiB")
            return (parse(body) if parse is not None else body), response.headers.get("content-type", "")
        except (aiohttp.ClientError, TimeoutError, MlxdError) as exc:
            error: MlxdError = exchange_error(exc, spec)
        except ValueError:
            error = broken(spec.name, "sent an answer that is not JSON")
        finally:
            self._end(link, key)
        raise self._failed(link, error)

    async def post_stream(self, path: str, *, json: Any = None, data: Any = None) -> StreamedAnswer:
        """An exchange whose answer is relayed as it arrives (synthesised
        audio, a streamed transcript's events): its head once the backend said yes within ``first_byte``,
        then its body read by read, each read within ``idle``; the typed
        error for a refusal, a timeout or a broken connection."""
        link = self._pool.link(self.backend)
        spec = link.spec
        key = self._begin(link)

        def finish(error: MlxdError | None) -> None:
            self._end(link, key)
            if error is not None:
                self._failed(link, error)

        try:
            async with asyncio.timeout(spec.first_byte_timeout_s):
                # Audio gains nothing from compression; the bytes go on as read.
                response = await self._sent(link, key, path, json=json, data=data,
                                            headers={"Accept-Encoding": "identity"})
        except (aiohttp.ClientError, TimeoutError, MlxdError) as exc:
            error = exchange_error(exc, spec)
            finish(error)
            raise error from None
        return StreamedAnswer(response, _body(response, spec), finish)

    def _begin(self, link: BackendLink) -> int:
        """An exchange starts: counted, and open for ``abort_all`` to cut."""
        key = next(self._ids)
        self._open[key] = None
        link.stats.in_flight += 1
        link.stats.requests += 1
        return key

    def _end(self, link: BackendLink, key: int) -> None:
        if key not in self._open:
            return  # ended already
        link.stats.in_flight -= 1
        self._aborted.discard(key)
        response = self._open.pop(key)
        if response is not None:
            # A finished answer's connection goes back to the pool; an
            # unfinished one's is closed, which is what tells the backend
            # to stop.
            response.release()

    async def _sent(self, link: BackendLink, key: int, path: str, *, json: Any = None, data: Any = None,
                    headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        return await send(link, self._pool.environ, "POST", path, json=json, data=data, headers=headers,
                          opened=lambda r: self._open.__setitem__(key, r))

    def _failed(self, link: BackendLink, error: MlxdError) -> MlxdError:
        self._pool.failed(self.backend, error)
        log.warning("backend %s (%s), %s: %s", link.spec.name, link.spec.url, self.name, describe_exception(error))
        return error

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

    async def clear_prefix_cache(self) -> bool:
        # The backend's cache is its own business.
        return False

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, "remote_model": self.remote_model, "in_flight": len(self._open)}


class StreamedAnswer:
    """A backend's answer as it arrives: its content type and the headers
    passed on, then ``chunks``; ``aclose`` ends the exchange (at once, or
    after the last chunk: either way once)."""

    def __init__(self, response: aiohttp.ClientResponse, chunks: AsyncIterator[bytes],
                 finish: Callable[[MlxdError | None], None]) -> None:
        self.content_type = response.headers.get("content-type", "")
        self.headers = {name: response.headers[name] for name in PASSED_HEADERS if name in response.headers}
        self._chunks = chunks
        self._finish = finish
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        error: MlxdError | None = None
        try:
            async for data in self._chunks:
                yield data
        except MlxdError as exc:
            error = exc
            raise
        finally:
            await self._chunks.aclose()  # type: ignore[attr-defined]
            self._close(error)

    async def aclose(self) -> None:
        await self._chunks.aclose()  # type: ignore[attr-defined]
        self._close(None)

    def _close(self, error: MlxdError | None) -> None:
        if not self._done:
            self._done = True
            self._finish(error)


async def _body(response: aiohttp.ClientResponse, spec: BackendSpec) -> AsyncIterator[bytes]:
    """The body read by read, each within the backend's idle timeout (a
    timer per read: an audio answer is a few large reads, not a token each)."""
    where = f"backend `{spec.name}`"
    while True:
        try:
            async with asyncio.timeout(spec.idle_timeout_s):
                data = await response.content.readany()
        except TimeoutError:
            raise BackendTimeout(f"{where} sent nothing for {spec.idle_timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise BackendFailed(f"{where} broke off the answer: {_reason(exc)}", retry_after=RETRY_BROKEN_S) from None
        if not data:
            return
        yield data


async def send(link: BackendLink, environ: Mapping[str, str], method: str, path: str, *,
               json: Any = None, data: Any = None, params: dict[str, str] | None = None,
               headers: dict[str, str] | None = None,
               opened: Callable[[aiohttp.ClientResponse], None] | None = None) -> aiohttp.ClientResponse:
    """One request to the backend, its answer once its status says yes; a
    redirect or an error status raises its typed error (the body read to at
    most ``MAX_ERROR_BODY_BYTES``). The caller bounds the wait and releases
    the answer; ``opened`` is told of it as soon as it exists."""
    spec = link.spec
    response = await link.client.request(method, spec.url + path, json=json, data=data, params=params,
                                         headers={**link.headers(environ), **(headers or {})},
                                         timeout=link.timeout(), allow_redirects=False)
    if opened is not None:
        opened(response)
    if response.status >= 300:
        try:
            await _refused(spec.name, response)
        finally:
            response.release()
    return response


def exchange_error(exc: BaseException, spec: BackendSpec) -> MlxdError:
    """What a failed exchange with ``spec``'s backend is to the client."""
    where = f"backend `{spec.name}`"
    if isinstance(exc, MlxdError):
        return exc
    # A connect timeout is also a TimeoutError: it is caught first, as the
    # backend being unreachable rather than slow to answer.
    if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
        return BackendUnavailable(f"Cannot reach {where}: {_reason(exc)}", retry_after=RETRY_UNREACHABLE_S)
    if isinstance(exc, TimeoutError):
        return BackendTimeout(f"No answer from {where} within {spec.first_byte_timeout_s:g} s")
    return BackendFailed(f"The request to {where} failed: {_reason(exc)}", retry_after=RETRY_BROKEN_S)


async def _refused(backend: str, response: aiohttp.ClientResponse) -> None:
    """Raise the error for an answer with a redirect or error status,
    after reading at most ``MAX_ERROR_BODY_BYTES`` of its body."""
    if response.status < 400:
        response.close()
        raise redirected(backend, response.status)
    body, cut = b"", True
    try:
        async with asyncio.timeout(ERROR_BODY_TIMEOUT_S):
            body, cut = await read_bounded(response, MAX_ERROR_BODY_BYTES)
    except (TimeoutError, aiohttp.ClientError):
        pass
    if cut:
        response.close()  # the rest is not worth reading
    raise upstream_error(backend, response.status, body, response.headers.get("retry-after"))


async def _fed(reader: StreamReader, data: bytes) -> GenerationChunk | None:
    """``data`` fed to ``reader`` a slice at a time, the loop free to run
    between slices (one huge read must not hold every other request up),
    and the output of all of them as one chunk."""
    if len(data) <= READ_SLICE_BYTES:
        return reader.feed(data)
    text, calls, thought = [], [], []
    for start in range(0, len(data), READ_SLICE_BYTES):
        chunk = reader.feed(data[start:start + READ_SLICE_BYTES])
        if chunk is not None:
            text.append(chunk.text)
            calls += chunk.tool_calls or []
            thought.append(chunk.reasoning)
        await asyncio.sleep(0)
    if not text:
        return None
    return GenerationChunk(text="".join(text), completion_tokens=reader.completion_tokens, tool_calls=calls or None,
                           reasoning="".join(thought))


class _Watchdog:
    """The idle timeout once the backend's answer has begun: the longest
    silence allowed between two reads (any bytes count, heartbeats and
    events the front does not relay included). Progress is a time stamp;
    one timer, re-armed only when it fires, checks it and expires
    ``deadline`` (which then cancels the read) once the silence is long
    enough. Rescheduling the deadline at every read would cost a timer per
    token."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: asyncio.Timeout, idle_s: float) -> None:
        self._loop = loop
        self._deadline = deadline
        self._idle = idle_s
        self._last = loop.time()
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
    """An aiohttp failure in a few plain words (its own text names hosts,
    sockets and parser internals)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name does not resolve"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connection refused" if isinstance(exc.os_error, ConnectionRefusedError) else "cannot connect"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "timed out connecting"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the connection was closed"
    if isinstance(exc, aiohttp.ClientPayloadError):
        text = str(exc)
        if "not completed" in text:
            return "the connection was closed mid-answer"
        return "an answer that does not decompress" if "decompress" in text.lower() else "a malformed HTTP answer"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "a malformed HTTP answer"
    if isinstance(exc, (aiohttp.ClientConnectionResetError, ConnectionResetError)):
        return "the connection was reset"
    return "the connection failed"
