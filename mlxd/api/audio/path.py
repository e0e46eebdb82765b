"""The one request path of the speech routes: the entry checked (its kind
serves the route, before any lease), the upload's header read and bounded
(size, decoded seconds, sample memory) and its samples decoded, both in a
thread (off the event loop and off the MLX worker), then a lease held while
the engine runs the model in worker steps, raced against the client's
disconnect and the deadline, and the accounts kept once."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request

from mlxd.api.audio.bodies import SpeechBody, TranscribeAsk
from mlxd.api.accounting import caller_field
from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.embeddings.path import entry_for
from mlxd.api.generation import guarded
from mlxd.api.inflight import InFlightRequest
from mlxd.api.preemptible import END, next_unless
from mlxd.api.request_ids import request_id_of
from mlxd.api.refusals import ACCOUNTED, SURFACES
from mlxd.engine import audio_files
from mlxd.engine.audio import SAMPLE_RATE, TranscribeOptions, Window
from mlxd.errors import BadRequest, MlxdError, PayloadTooLarge
from mlxd.monitoring.activity import ActivityRow
from mlxd.monitoring.usage import one_request
from mlxd.registry.kinds import SPEAK, TRANSCRIBE
from mlxd.registry.model import ModelSpec
from mlxd.registry.sizing import format_bytes

log = logging.getLogger("mlxd.requests")


@dataclass(frozen=True)
class Transcript:
    model: str
    windows: list[Window]
    duration: float
    options: TranscribeOptions


def _local(ctx: DaemonContext, request: Request, name: str, route: str) -> ModelSpec:
    """The entry ``name`` as the caller may use it (its app's scope applies)."""
    spec = entry_for(ctx, name, route, caller_of(request))
    if spec.is_remote:
        raise BadRequest(f"`{name}` is served by a backend", param="model")
    return spec


# --- relayed to a backend ----------------------------------------------------------


async def relay_transcription(ctx: DaemonContext, request: Request, ask: TranscribeAsk,
                              task: str) -> tuple[bytes, str] | RelayedStream | None:
    """A remote entry's transcription: the upload sent on as it came (the
    backend bounds and decodes it) and its answer returned as sent, whole,
    or for ``stream=true`` its events passed through as they arrive; None
    for a local entry."""
    spec = entry_for(ctx, ask.model, TRANSCRIBE, caller_of(request))
    if not spec.is_remote:
        return None
    fields: dict[str, str | list[str]] = {"response_format": ask.response_format}
    for name, value in (("language", ask.language), ("prompt", ask.prompt), ("temperature", ask.temperature)):
        if value is not None:
            fields[name] = str(value)
    if ask.granularities:
        fields["timestamp_granularities[]"] = list(ask.granularities)
    route = "/audio/transcriptions" if task == "transcribe" else "/audio/translations"
    upload = (ask.filename, ask.file)
    if ask.stream:
        fields["stream"] = "true"
        return await _relayed(ctx, request, spec, task, 0.0,
                              lambda engine: engine.post_stream(route, data=engine.form(fields, upload)))
    async with _accounted(ctx, request, spec.name, task, 0.0):
        return await guarded(request, _leased(ctx, request, spec, lambda engine: engine.post_form(
            route, fields, upload)), ctx.settings.server.request_timeout_s)


@dataclass(frozen=True)
class RelayedStream:
    """A backend's answer relayed as it arrives (synthesised audio, a
    transcript's events): the headers it answered with (its content type,
    an audio's sample rate) and the bytes."""

    content_type: str
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]


async def relay_speech(ctx: DaemonContext, request: Request, body: SpeechBody) -> RelayedStream | None:
    """A remote entry's speech: the body sent on, the audio passed through
    as it arrives; None for a local entry."""
    spec = entry_for(ctx, body.model, SPEAK, caller_of(request))
    if not spec.is_remote:
        return None
    ask = body.model_dump(exclude_none=True, exclude={"model"})
    return await _relayed(ctx, request, spec, "speech", float(len(body.input)),
                          lambda engine: engine.post_stream("/audio/speech", json={**ask, "model": engine.remote_model}))


async def _relayed(ctx: DaemonContext, request: Request, spec: ModelSpec, what: str, amount: float,
                   send: Callable[[Any], Any]) -> RelayedStream:
    """The backend's answer to ``send``, passed through read by read under
    the entry's lease, which the stream gives back when it ends or its
    client leaves (the backend's refusal, before any byte, is an error answer)."""
    heads: list[Any] = []

    async def relayed(engine: Any) -> AsyncIterator[bytes]:
        answer = await send(engine)
        heads.append(answer)
        try:
            yield b""  # the backend said yes: the front answers 200 now
            async for data in answer.chunks():
                yield data
        finally:
            await answer.aclose()

    chunks = await _streamed(ctx, request, spec, what, amount, relayed, lambda data: 0.0)
    return RelayedStream(heads[0].content_type, heads[0].headers, chunks)


async def read_audio(ctx: DaemonContext, data: bytes) -> np.ndarray:
    """The upload's samples at the models' rate, after its header passed the bounds."""
    server = ctx.settings.server
    info = await asyncio.to_thread(audio_files.probe, data, server.max_audio_seconds)
    if info.seconds > server.max_audio_seconds:
        raise BadRequest(f"The audio is {info.seconds:.0f} s long; this server takes at most "
                         f"{server.max_audio_seconds:.0f} s (server.max_audio_seconds).", param="file",
                         code="audio_too_long")
    # The file's samples as decoded (float32, every channel) and the mono
    # copy at the models' rate, held at once while resampling.
    needs = int(info.seconds * (info.sample_rate * info.channels + SAMPLE_RATE) * 4)
    if needs > server.max_audio_memory_bytes:
        raise PayloadTooLarge(f"Decoding this audio would take {format_bytes(needs)}, more than this server "
                              f"allows ({format_bytes(server.max_audio_memory_bytes)}, server.max_audio_memory).")
    return await asyncio.to_thread(audio_files.decode, data, info, SAMPLE_RATE)


def options_for(ask: TranscribeAsk, task: str) -> TranscribeOptions:
    return TranscribeOptions(
        task=task, language=ask.language, prompt=ask.prompt,
        temperature=ask.temperature, timestamps=ask.response_format in ("verbose_json", "srt", "vtt"),
        words="word" in ask.granularities)


async def transcribe(ctx: DaemonContext, request: Request, ask: TranscribeAsk, task: str) -> Transcript:
    spec = _local(ctx, request, ask.model, TRANSCRIBE)
    samples = await read_audio(ctx, ask.file)
    options = options_for(ask, task)

    accounted = _accounted(ctx, request, spec.name, task, samples.size / SAMPLE_RATE)

    async def work(engine: Any) -> Transcript:
        windows = [w async for w in engine.transcribe(samples, options, _request_id(request))]
        accounted.tokens_out = sum(map(transcript_tokens, windows))
        return Transcript(ask.model, windows, samples.size / SAMPLE_RATE, options)

    async with accounted:
        ticket = _listed(ctx, request, spec.name, task, stream=False)
        try:
            return await guarded(request, _leased(ctx, request, spec, work), ctx.settings.server.request_timeout_s,
                                 ticket.cancelled)
        finally:
            ctx.inflight.remove(ticket)


def transcript_tokens(window: Window) -> int:
    """The text tokens the model wrote for ``window``: what a transcription
    counts in its app's usage and token limits (audio has no tokens of its own)."""
    return sum(len(segment.get("tokens") or ()) for segment in window.segments)


async def transcribe_stream(ctx: DaemonContext, request: Request, ask: TranscribeAsk,
                            task: str) -> AsyncIterator[Window]:
    """The windows as they are transcribed, under a lease taken before the
    first one (so a failure to get one is still a plain error answer)."""
    spec = _local(ctx, request, ask.model, TRANSCRIBE)
    samples = await read_audio(ctx, ask.file)
    options = options_for(ask, task)
    seconds = samples.size / SAMPLE_RATE
    return await _streamed(ctx, request, spec, task, seconds,
                           lambda engine: engine.transcribe(samples, options, _request_id(request)),
                           lambda window: 0.0, audio_seconds=seconds, tokens_of=transcript_tokens)


async def speech(ctx: DaemonContext, request: Request, body: SpeechBody) -> tuple[int, AsyncIterator[np.ndarray]]:
    """The model's sample rate and its audio chunks, the first one already made."""
    limit = ctx.settings.server.max_speech_chars
    if len(body.input) > limit:
        raise BadRequest(f"`input` is {len(body.input)} characters; at most {limit} are read "
                         "(server.max_speech_chars).", param="input", code="string_above_max_length")
    if not body.input.strip():
        # A model given only spaces or line breaks makes no sample, and the
        # answer was a 200 with an empty file.
        raise BadRequest("`input` holds nothing to speak: it is only whitespace.", param="input",
                         code="empty_input")
    spec = _local(ctx, request, body.model, SPEAK)
    rate: list[int] = []

    def start(engine: Any) -> AsyncIterator[np.ndarray]:
        rate.append(engine.sample_rate)
        return engine.synthesise(body.input, body.voice, body.speed, _request_id(request))

    chunks = await _streamed(ctx, request, spec, "speech", float(len(body.input)), start,
                             lambda chunk: chunk.size / rate[0])
    return rate[0], chunks


async def voices(ctx: DaemonContext, request: Request, name: str | None) -> list[tuple[str, list[str]]]:
    """Each speech model's voices, no lease taken: a local model's read from
    its folder, a remote one's asked of its backend (all at once, each
    within a bounded time); a backend that fails is left out."""
    caller = caller_of(request)
    if name is not None:
        named = [(name, entry_for(ctx, name, SPEAK, caller))]
    else:
        named = [(s.name, s) for s in ctx.registry.models
                 if _speaks(ctx, s) and caller.may_use(*s.names())]
    found = await asyncio.gather(*(_voices_of(ctx, spec) for _, spec in named))
    return [(shown, names) for (shown, _), names in zip(named, found) if names is not None]


def _speaks(ctx: DaemonContext, spec: ModelSpec) -> bool:
    """Whether ``spec`` is a speech model (a remote entry: by the kind it declares)."""
    kind = ctx.registry.kinds.get(spec.kind)
    return kind is not None and SPEAK in kind.routes


async def _voices_of(ctx: DaemonContext, spec: ModelSpec) -> list[str] | None:
    """``spec``'s voices; None (and a warning) for a backend that failed."""
    from mlxd.engine.audio import folder_voices

    if not spec.is_remote:
        return folder_voices(spec.path)
    from mlxd.remote.voices import backend_voices  # aiohttp: only where there are backends

    try:
        return await backend_voices(ctx.backends, spec)
    except MlxdError as exc:
        log.warning("voices of %s left out: backend %s did not list them: %s", spec.name, spec.backend,
                    exc.message)
        return None


# --- leases ------------------------------------------------------------------------


def _request_id(request: Request) -> str:
    return str(getattr(request.state, "request_id", "") or request.headers.get("x-request-id", ""))


async def _leased(ctx: DaemonContext, request: Request, spec: ModelSpec, work: Callable[[Any], Any]) -> Any:
    lease = await ctx.manager.acquire(spec.name, timeout=ctx.settings.server.request_timeout_s,
                                      caller=caller_of(request))
    try:
        return await work(lease.engine)
    finally:
        lease.release()


async def _streamed(ctx: DaemonContext, request: Request, spec: ModelSpec, what: str, amount: float,
                    start: Callable[[Any], AsyncIterator[Any]], seconds_of: Callable[[Any], float], *,
                    audio_seconds: float = 0.0, tokens_of: Callable[[Any], int] = lambda item: 0
                    ) -> AsyncIterator[Any]:
    """A lease and the engine's stream, its first item awaited here (a
    refusal is an error answer, not a broken stream); the stream then owns
    the lease and gives it back when it ends or its client leaves.
    ``seconds_of`` an item: the audio it made, added to ``audio_seconds``;
    ``tokens_of`` an item: the text tokens it wrote."""
    timeout = ctx.settings.server.request_timeout_s
    started = time.monotonic()
    planned(request)
    ticket = _listed(ctx, request, spec.name, what, stream=True)
    lease: Any = None
    stream: Any = None
    try:
        lease = await guarded(request, ctx.manager.acquire(spec.name, timeout=timeout, caller=caller_of(request)),
                              timeout, ticket.cancelled)
        stream = start(lease.engine)
        first = await guarded(request, stream.__anext__(), timeout, ticket.cancelled)
    except StopAsyncIteration:
        first = None
    except BaseException as exc:
        # A lease refused (no room, a deadline) is accounted like a failure.
        ctx.inflight.remove(ticket)
        if lease is not None:
            lease.release()
        if stream is not None:
            await stream.aclose()
        _account(ctx, request, spec.name, what, exc.status_code if isinstance(exc, MlxdError) else 500,
                  time.monotonic() - started, amount, stream=True, error=_error_of(exc))
        raise

    async def rest() -> AsyncIterator[Any]:
        status = 200
        made = audio_seconds
        tokens = 0
        error: str | None = None
        try:
            if first is not None:
                made, tokens = made + seconds_of(first), tokens + tokens_of(first)
                yield first
                # Identity, not `in`: a chunk is a numpy array.
                while (item := await next_unless(stream, ticket.cancelled)) is not None and item is not END:
                    made, tokens = made + seconds_of(item), tokens + tokens_of(item)
                    yield item
                if ticket.cancelled.is_set():
                    status, error = 499, "cancelled"
        except (GeneratorExit, asyncio.CancelledError):
            status = 499  # the client went away mid-stream: not a failure of ours
            raise
        except BaseException as exc:
            status, error = exc.status_code if isinstance(exc, MlxdError) else 500, _error_of(exc)
            raise
        finally:
            ctx.inflight.remove(ticket)
            lease.release()
            await stream.aclose()
            _account_soon(ctx, request, spec.name, what, status, time.monotonic() - started, amount, made,
                          error=error, tokens_out=tokens)

    return rest()


def _listed(ctx: DaemonContext, request: Request, name: str, what: str, *, stream: bool) -> InFlightRequest:
    """The request in the requests under way (``GET /v1/requests``, the
    dashboard), where its key or an admin can cancel it, as a chat's."""
    rid = request_id_of(request.scope)
    return ctx.inflight.add(InFlightRequest(request_id=rid, response_id=rid, model=name, surface=what,
                                            caller=caller_of(request).name, stream=stream))


class _accounted:
    """Counts one request (its status, its seconds) however it ends."""

    def __init__(self, ctx: DaemonContext, request: Request, name: str, what: str, amount: float) -> None:
        self.ctx, self.request, self.name, self.what, self.amount = ctx, request, name, what, amount
        # The text tokens a transcription wrote (set by the work it counts).
        self.tokens_out = 0

    async def __aenter__(self) -> None:
        self.started = time.monotonic()
        planned(self.request)

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        status = 200 if exc is None else exc.status_code if isinstance(exc, MlxdError) else 500
        _account(self.ctx, self.request, self.name, self.what, status, time.monotonic() - self.started,
                 self.amount, self.amount, error=None if exc is None else _error_of(exc), tokens_out=self.tokens_out)


def _error_of(exc: BaseException) -> str:
    """What the activity row says of a failure: its client's message, or
    only that it was internal (the log has the traceback)."""
    return exc.message if isinstance(exc, MlxdError) else "internal error"


def planned(request: Request) -> None:
    """From here on the request writes its own activity row (``_account``),
    however it ends; a refusal before this point is ``api.refusals``' row."""
    request.scope.setdefault("state", {})[ACCOUNTED] = True


def _account_soon(ctx: DaemonContext, request: Request, name: str, what: str, status: int, seconds: float,
                  amount: float, audio_seconds: float, *, error: str | None, tokens_out: int) -> None:
    """A stream's ``_account``, once the answer's last byte is written: this
    runs as the stream ends, before the response's final (empty) body goes
    out, and the row, usage, limits, metrics and log line took about 0.3 ms
    there on a 2-core CPU, which the client waited for. The final write
    happens in the same task step, so a callback queued now runs after it,
    and before anything the client can send next."""
    account = functools.partial(_account, ctx, request, name, what, status, seconds, amount, audio_seconds,
                                stream=True, error=error, tokens_out=tokens_out)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # finalised outside the loop: at once
        account()
        return
    loop.call_soon(account)


def _account(ctx: DaemonContext, request: Request, name: str, what: str, status: int, seconds: float,
             amount: float, audio_seconds: float = 0.0, *, stream: bool = False, error: str | None = None,
             tokens_out: int = 0) -> None:
    caller = caller_of(request)
    tokens_out = tokens_out if status == 200 else 0
    if ctx.activity is not None:
        ctx.activity.add(ActivityRow(
            time=time.time(), request_id=_request_id(request), response_id="", key=caller.name, model=name,
            target=name, surface=SURFACES[request.scope["path"]], stream=stream, status=status, tokens_in=0,
            tokens_cached=0, tokens_out=tokens_out, ttft_seconds=None, tokens_per_second=None,
            duration_seconds=round(seconds, 4), finish_reason=None, error=error))
    ctx.usage.add(caller.name, name, one_request(status, tokens_out=tokens_out))
    ctx.limits.spend(caller.app, tokens_out)
    ctx.metrics.requests.labels(name, str(status)).inc()
    ctx.metrics.request_seconds.labels(name).observe(seconds)
    if status == 200:
        ctx.metrics.audio_seconds.labels(name, what).inc(audio_seconds)
    unit = "chars" if what == "speech" else "audio_seconds"
    log.info("%s model=%s status=%d %s=%.1f seconds=%.3f%s request_id=%s", what, name, status, unit, amount,
             seconds, caller_field(caller), _request_id(request))
