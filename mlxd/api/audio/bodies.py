"""Request bodies of the speech routes, parsed once into the request path's
values: a multipart upload (``TranscribeAsk``), a JSON body (``SpeechBody``)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from mlxd.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from mlxd.registry.sizing import format_bytes

TRANSCRIPT_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
GRANULARITIES = ("segment", "word")
# What a stream of transcript.text events can carry.
STREAM_FORMATS = ("json", "text")
# Files a form may hold before Starlette refuses it unread: more than the one
# ``file``, so that a second one, or a text field sent as a file, is named.
MAX_FORM_FILES = 4


@dataclass(frozen=True)
class TranscribeAsk:
    model: str
    file: bytes
    filename: str
    language: str | None
    prompt: str | None
    temperature: float | None
    response_format: str
    granularities: tuple[str, ...]
    stream: bool


def _one(form: object, name: str) -> str | None:
    values = form.getlist(name)  # type: ignore[attr-defined]
    if not values:
        return None
    value = values[-1]
    if not isinstance(value, str):
        raise BadRequest(f"`{name}` must be a text field, not a file", param=name)
    return value


async def transcribe_ask(request: Request, max_audio_bytes: int) -> TranscribeAsk:
    """OpenAI's multipart form: ``file``, ``model``, ``language``, ``prompt``,
    ``temperature``, ``response_format``, ``timestamp_granularities[]``, ``stream``."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise UnsupportedMediaType("Send the audio as multipart/form-data with a `file` field.")
    try:
        form = await request.form(max_files=MAX_FORM_FILES, max_fields=32)
    except HTTPException as exc:  # Starlette's words for what it refused ("Too many fields ...")
        raise BadRequest(f"The multipart body cannot be read: {exc.detail}") from exc
    except Exception as exc:  # a malformed multipart body
        raise BadRequest(f"The multipart body cannot be read ({type(exc).__name__}).") from exc
    files = form.getlist("file")
    if len(files) > 1:
        raise BadRequest(f"Send one `file`: a request transcribes one audio file, and this one has {len(files)}",
                         param="file")
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise BadRequest("`file` is required: the audio file, as a multipart file field", param="file")
    model = _one(form, "model")
    if not model:
        raise BadRequest("`model` is required", param="model")
    size = upload.size if upload.size is not None else 0
    if size > max_audio_bytes:
        raise PayloadTooLarge(f"The audio file is {format_bytes(size)}; this server takes at most "
                              f"{format_bytes(max_audio_bytes)} (server.max_audio_bytes).")
    data = await upload.read(max_audio_bytes + 1)
    if len(data) > max_audio_bytes:
        raise PayloadTooLarge(f"The audio file is larger than {format_bytes(max_audio_bytes)} "
                              "(server.max_audio_bytes).")
    response_format = _one(form, "response_format") or "json"
    if response_format not in TRANSCRIPT_FORMATS:
        raise BadRequest(f"`response_format` must be one of {', '.join(TRANSCRIPT_FORMATS)}",
                         param="response_format")
    granularities = tuple(form.getlist("timestamp_granularities[]") or form.getlist("timestamp_granularities"))
    for g in granularities:
        if g not in GRANULARITIES:
            raise BadRequest(f"`timestamp_granularities[]` takes {' and '.join(GRANULARITIES)}, not {g!r}",
                             param="timestamp_granularities[]")
    if granularities and response_format != "verbose_json":
        raise BadRequest("`timestamp_granularities[]` needs `response_format: verbose_json`",
                         param="timestamp_granularities[]")
    stream = (_one(form, "stream") or "false").lower() == "true"
    if stream and response_format not in STREAM_FORMATS:
        # The events carry text only; the timestamps (word ones cost a
        # second pass per window) were computed and dropped.
        raise BadRequest(f"`stream: true` sends the transcript as text events, without timestamps: "
                         f"`response_format` must be json or text, not {response_format}", param="stream")
    language = _one(form, "language") or None
    if language is not None:
        # mlx-audio's Whisper package takes about a second to import the first
        # time: off the event loop.
        language = await asyncio.to_thread(language_code, language)
    return TranscribeAsk(
        model=model, file=data, filename=upload.filename or "", language=language,
        prompt=_one(form, "prompt") or None, temperature=_temperature(_one(form, "temperature")),
        response_format=response_format, granularities=granularities,
        stream=stream)


def language_code(value: str) -> str:
    """``language`` as the ISO-639-1 code mlx-audio's Whisper tokenizer
    knows, from a code in any case ("EN"), an English name ("French",
    "Castilian") or a code with a region ("en-US"). Anything else is a 400:
    Whisper was handed it as it came, decoded with no language token and
    echoed it back in verbose_json."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    said = value.strip().lower()
    primary = said.replace("_", "-").split("-")[0]
    for candidate in (said, primary):
        if candidate in LANGUAGES:
            return candidate
        if candidate in TO_LANGUAGE_CODE:
            return TO_LANGUAGE_CODE[candidate]
    raise BadRequest(f"`language` {value!r} is not a language Whisper knows: give its ISO-639-1 code "
                     "(en, fr, de, ...) or its English name", param="language", code="unsupported_language")


def _temperature(value: str | None) -> float | None:
    """OpenAI's 0 (the default) lets the model raise the temperature when a
    window decodes badly (mlx-audio's fallback ladder); above 0, that one."""
    if value is None or value == "":
        return None
    try:
        t = float(value)
    except ValueError:
        raise BadRequest("`temperature` must be a number between 0 and 1", param="temperature") from None
    if not (math.isfinite(t) and 0.0 <= t <= 1.0):
        raise BadRequest("`temperature` must be between 0 and 1", param="temperature")
    return None if t == 0.0 else t


class SpeechBody(BaseModel):
    """OpenAI's POST /v1/audio/speech."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(min_length=1)
    input: str = Field(min_length=1)
    voice: str | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    response_format: Literal["wav", "pcm", "flac", "mp3"] = "mp3"
    instructions: str | None = None
    stream_format: Literal["audio"] = "audio"
