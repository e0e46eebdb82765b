"""/v1/audio/transcriptions, /v1/audio/translations, /v1/audio/speech and
/v1/audio/voices: each a body parsed, the one path (``path.py``), an answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mlxd.api.audio import answers, path
from mlxd.api.audio.bodies import SpeechBody, transcribe_ask
from mlxd.api.context import DaemonContext
from mlxd.api.generation import ClosingStreamingResponse
from mlxd.engine.audio_files import MEDIA_TYPES
from mlxd.engine.audio_stream import StreamEncoder
from mlxd.errors import MlxdError
from mlxd.remote.answer import MAX_EVENT_BYTES

PREFIX = "/v1/audio"


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


def router() -> APIRouter:
    api = APIRouter()

    async def transcription(request: Request, task: str) -> Response:
        ctx = _ctx(request)
        ask = await transcribe_ask(request, ctx.settings.server.max_audio_bytes)
        relayed = await path.relay_transcription(ctx, request, ask, task)
        if isinstance(relayed, path.RelayedStream):
            return ClosingStreamingResponse(_relayed_events(relayed.chunks), relayed.chunks, headers=relayed.headers,
                                            media_type=relayed.content_type or "text/event-stream")
        if relayed is not None:
            return Response(relayed[0], media_type=relayed[1] or None)
        if ask.stream:
            windows = await path.transcribe_stream(ctx, request, ask, task)
            return ClosingStreamingResponse(_transcript_events(windows), windows, media_type="text/event-stream")
        done = await path.transcribe(ctx, request, ask, task)
        return answers.transcript(done.windows, ask.response_format, task=task, language=done.options.language,
                                  duration=done.duration, granularities=ask.granularities)

    @api.post(PREFIX + "/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await transcription(request, "transcribe")

    @api.post(PREFIX + "/translations")
    async def translations(request: Request) -> Response:
        return await transcription(request, "translate")

    @api.post(PREFIX + "/speech")
    async def speech(body: SpeechBody, request: Request) -> Response:
        relayed = await path.relay_speech(_ctx(request), request, body)
        if relayed is not None:
            return ClosingStreamingResponse(_nonempty(relayed.chunks), relayed.chunks, headers=relayed.headers,
                                            media_type=relayed.content_type or MEDIA_TYPES[body.response_format])
        rate, chunks = await path.speech(_ctx(request), request, body)
        return ClosingStreamingResponse(_encoded(chunks, body.response_format, rate), chunks,
                                        media_type=MEDIA_TYPES[body.response_format],
                                        headers={"X-Sample-Rate": str(rate)})

    @api.get(PREFIX + "/voices")
    async def voices(request: Request, model: str | None = None) -> Response:
        found = await path.voices(_ctx(request), request, model)
        return JSONResponse({"object": "list", "data": [
            {"id": voice, "name": voice, "model": name} for name, names in found for voice in names]})

    return api


async def _transcript_events(windows: AsyncIterator[path.Window]) -> AsyncIterator[bytes]:
    """OpenAI's transcription stream: a delta per window, then the whole text."""
    texts: list[str] = []
    end = 0.0
    try:
        async for window in windows:
            if window.text:
                yield answers.delta_event(window.text if texts else window.text.lstrip())
            texts.append(window.text)
            end = window.end
    except MlxdError as exc:
        yield answers.error_event(exc.body())
        return
    yield answers.done_event("".join(texts).strip(), end)


async def _relayed_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A backend's transcript events passed on whole, each as soon as its
    last byte came; a backend that breaks off mid-way (a dropped connection,
    its idle timeout) ends the stream with an error event, as a local
    transcript's failure does, instead of a cut body the client cannot tell
    from a finished one. Its partial event, if any, is not passed on. Bytes
    that end no event within the chat relay's event bound go on as they are,
    so nothing held grows past it."""
    held = b""
    try:
        async for data in chunks:
            held += data
            end = _events_end(held) if len(held) <= MAX_EVENT_BYTES else len(held)
            if end:
                yield held[:end]
                held = held[end:]
    except MlxdError as exc:
        yield answers.error_event(exc.body())
        return
    if held:
        yield held


def _events_end(data: bytes) -> int:
    """Where the last complete event in ``data`` ends (0: none), whichever
    of the line ends SSE allows (LF, CRLF, CR) the backend writes."""
    return max(data.rfind(blank) + len(blank) if blank in data else 0
               for blank in (b"\n\n", b"\r\n\r\n", b"\r\r"))


async def _nonempty(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for data in chunks:
        if data:
            yield data


async def _encoded(chunks: AsyncIterator[np.ndarray], fmt: str, rate: int) -> AsyncIterator[bytes]:
    """Each chunk encoded as soon as the model made it: off the event loop
    unless that is a cast (``StreamEncoder.cheap``)."""
    encoder = StreamEncoder(fmt, rate)
    async for chunk in chunks:
        data = encoder.feed(chunk) if encoder.cheap(chunk.size) else await asyncio.to_thread(encoder.feed, chunk)
        if data:
            yield data
    tail = encoder.close() if encoder.cheap(0) else await asyncio.to_thread(encoder.close)
    if tail:
        yield tail
