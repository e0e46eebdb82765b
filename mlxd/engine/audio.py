"""The engines of ``kind: transcription`` and ``kind: speech`` models (mlx-audio).

Both run their model exactly as mlx-audio's own ``generate`` does, on the
MLX worker, as steps of a worker stream: a transcription takes one step per
window of the model's length (Whisper's 30 s), a synthesis one step per
segment mlx-audio yields (Soprano one per audio token: ``audio_soprano``), so a long file or a long text takes turns with
every other stream on the worker (chat decode steps, embedding batches)
instead of holding it. Audio at most one window long is one call to
mlx-audio's ``generate``, with the arguments a direct call would pass.

The MLX random state is seeded at the start of each request: sampling
(Whisper's temperature fallback, Soprano's top-p) then gives the same
output for the same input, as a direct call after ``mx.random.seed`` does.

Residency sees an ordinary engine: a footprint (the load, raised to the
first request's peak), ``close`` that waits for the step in flight,
``abort_all`` that stops requests at their next step.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxd.engine import memory
from mlxd.engine.host_arrays import to_numpy
from mlxd.engine.lifecycle import EngineBase, GenerationControl, load_on_worker, measured_load, warm_after_load
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.engine.warmup import WarmupReport
from mlxd.engine.whisper_ladder import warm_ladder
from mlxd.engine.worker import MlxWorker
from mlxd.errors import BadRequest, ModelPreempted, ModelUnloaded
from mlxd.registry.model import ModelSpec

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000  # what mlx-audio's speech-to-text models read
SEED = 0
# Whisper's window; other models take the whole file in one step.
WHISPER_WINDOW_S = 30.0


@dataclass(frozen=True)
class TranscribeOptions:
    task: str = "transcribe"  # or "translate"
    language: str | None = None
    prompt: str | None = None
    # None: mlx-audio's fallback ladder (0.0 ... 1.0), as OpenAI's 0 means.
    temperature: float | None = None
    timestamps: bool = True
    words: bool = False


@dataclass
class Window:
    """One window's transcript: its text, and its segments in file time."""

    text: str
    language: str | None
    segments: list[dict[str, Any]]
    start: float
    end: float


@dataclass
class AudioFigures:
    """For status and /metrics. Event loop only."""

    requests: int = 0
    audio_seconds: float = 0.0
    steps: int = 0
    failures: int = 0


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments ``fn`` takes (all of them if it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


class AudioEngine(EngineBase):
    """What both audio engines share: the model, one request at a time per
    stream, figures, release."""

    def __init__(self, spec: ModelSpec, worker: MlxWorker, model: Any, *, load_bytes: int,
                 load_seconds: float, warmup: WarmupReport | None = None) -> None:
        super().__init__(spec, worker, load_bytes=load_bytes, load_seconds=load_seconds, warmup=warmup)
        self.kind = spec.kind
        self.model: Any = model
        self.figures = AudioFigures()

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        route = "audio/transcriptions" if self.kind == "transcription" else "audio/speech"
        raise BadRequest(f"The model `{self.name}` is a {self.kind} model; it does not generate text "
                         f"(use /v1/{route}).", param="model", code="model_not_supported")

    async def _stepped(self, steps: Iterator[Any], request_id: str) -> AsyncIterator[Any]:
        """``steps`` run on the worker one item per turn, under a control
        that an unload or preemption flags."""
        if self._closed:
            raise ModelUnloaded(self.name)
        control = GenerationControl(request_id)
        self._in_flight.add(control)
        self.figures.requests += 1
        stream = self._worker.stream(lambda: self._guarded(steps, control))
        try:
            async for item in stream:
                self.figures.steps += 1
                yield item
        except BaseException:
            self.figures.failures += 1
            raise
        finally:
            self._in_flight.discard(control)
            await stream.aclose()

    def _guarded(self, steps: Iterator[Any], control: GenerationControl) -> Iterator[Any]:
        """Worker thread: seed, then each step measured, stopping at an abort."""
        import mlx.core as mx

        self.counts.running += 1
        try:
            mx.random.seed(SEED)
            while True:
                if control.abort_reason is not None:
                    raise (ModelUnloaded(self.name) if control.abort_reason == "unloaded" else ModelPreempted(
                        f"Work on `{self.name}` was interrupted: the model was preempted or the daemon "
                        "is shutting down"))
                if self.model is None:
                    raise ModelUnloaded(self.name)
                with self.peak.measure():
                    try:
                        item = next(steps)
                    except StopIteration:
                        return
                yield item
        finally:
            self.counts.running -= 1
            close = getattr(steps, "close", None)
            if close is not None:
                close()

    def stats(self) -> dict[str, Any]:
        f = self.figures
        return {**super().stats(), "requests": f.requests, "audio_seconds": round(f.audio_seconds, 3),
                "steps": f.steps, "failures": f.failures}

    def _release(self) -> dict[str, Any]:
        self.model = None
        memory.release_memory()
        return {}

    def _forget(self) -> None:
        self.model = None


class TranscriptionEngine(AudioEngine):
    """A speech-to-text model: Whisper, or any mlx-audio STT model."""

    @property
    def window_seconds(self) -> float | None:
        """The length the model reads at once (None: the whole file)."""
        return WHISPER_WINDOW_S if hasattr(self.model, "get_tokenizer") else None

    @property
    def translates(self) -> bool:
        """Whether the model has a translate task (a multilingual Whisper)."""
        return bool(getattr(self.model, "is_multilingual", False))

    @property
    def languages(self) -> tuple[str, ...]:
        """The language codes the model has a token for: an English-only
        Whisper none but English, a multilingual one its first
        ``num_languages`` of the tokenizer's list (Cantonese is the 100th,
        which 99-language checkpoints lack); any for a model without Whisper's
        tokens (its ``generate`` takes the language as it likes)."""
        from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

        if not hasattr(self.model, "get_tokenizer"):
            return tuple(LANGUAGES)
        if not self.translates:
            return ("en",)
        return tuple(LANGUAGES)[: self.model.num_languages]

    def transcribe(self, samples: np.ndarray, options: TranscribeOptions,
                   request_id: str = "") -> AsyncIterator[Window]:
        """The transcript window by window, in file time."""
        if options.task == "translate" and not self.translates:
            raise BadRequest(f"The model `{self.name}` cannot translate (it is not a multilingual Whisper).",
                             param="model", code="model_not_supported")
        if options.language is not None and options.language not in self.languages:
            has = "reads only English (en)" if self.languages == ("en",) else "has no token for that language"
            raise BadRequest(f"The model `{self.name}` cannot take `language` {options.language!r}: it {has}.",
                             param="language", code="unsupported_language")
        self.figures.audio_seconds += samples.size / SAMPLE_RATE
        return self._stepped(self._windows(samples, options), request_id)

    def generate_kwargs(self, options: TranscribeOptions) -> dict[str, Any]:
        """What mlx-audio's ``generate`` is handed for ``options``: exactly
        the arguments a direct call with the same wishes passes."""
        kwargs: dict[str, Any] = {}
        if hasattr(self.model, "get_tokenizer"):  # Whisper's options
            kwargs["task"] = options.task
            kwargs["language"] = options.language
            kwargs["initial_prompt"] = options.prompt
            kwargs["return_timestamps"] = options.timestamps or options.words
            kwargs["word_timestamps"] = options.words
            if options.temperature is not None:
                kwargs["temperature"] = options.temperature
        elif options.language is not None:
            kwargs["language"] = options.language
        return _accepted(self.model.generate, kwargs)

    def _windows(self, samples: np.ndarray, options: TranscribeOptions) -> Iterator[Window]:
        """Worker thread: one mlx-audio ``generate`` per window."""
        window = self.window_seconds
        size = samples.size if window is None else int(window * SAMPLE_RATE)
        kwargs = self.generate_kwargs(options)
        for at in range(0, max(samples.size, 1), size):
            piece = samples[at:at + size]
            start = at / SAMPLE_RATE
            # A window shorter than a tenth of a second holds no word.
            if at and piece.size < SAMPLE_RATE // 10:
                break
            result = self.model.generate(piece, **kwargs)
            yield _window(result, start, start + piece.size / SAMPLE_RATE)
            if at == 0 and "language" in kwargs and kwargs["language"] is None:
                # Later windows keep the language the first one detected.
                kwargs["language"] = getattr(result, "language", None)


def folder_voices(path: Path | str) -> list[str]:
    """The voices in a speech model's folder (``voices/*``, as Kokoro ships
    them); a model without any has its one voice, ``default``."""
    folder = Path(path) / "voices"
    if folder.is_dir():
        return sorted({p.stem for p in folder.iterdir() if p.suffix in (".safetensors", ".pt", ".npy")})
    return ["default"]


def _window(result: Any, start: float, end: float) -> Window:
    """Worker thread: one window's result in file time. ``seek`` is Whisper's
    position in mel frames, counted from the window's start as ``start`` is:
    a second window's segments said 30.0 s but seek 0."""
    from mlx_audio.stt.models.whisper.audio import FRAMES_PER_SECOND

    text = str(getattr(result, "text", "") or "")
    language = getattr(result, "language", None)
    offset = round(start * FRAMES_PER_SECOND)
    segments = []
    for seg in getattr(result, "segments", None) or []:
        seg = dict(seg)
        seg["start"] = float(seg.get("start", 0.0)) + start
        seg["end"] = float(seg.get("end", 0.0)) + start
        seg["seek"] = int(seg.get("seek", 0)) + offset
        if seg.get("words"):
            seg["words"] = [{**w, "start": float(w["start"]) + start, "end": float(w["end"]) + start}
                            for w in seg["words"]]
        segments.append(seg)
    if not segments and text:
        segments = [{"id": 0, "seek": offset, "start": start, "end": end, "text": text}]
    return Window(text, language if isinstance(language, str) else None, segments, start, end)


class SpeechEngine(AudioEngine):
    """A text-to-speech model of mlx-audio (Soprano, Kokoro, ...)."""

    @property
    def sample_rate(self) -> int:
        return int(getattr(self.model, "sample_rate", 24000))

    def voices(self) -> list[str]:
        return list(self._voices)

    @functools.cached_property
    def _voices(self) -> tuple[str, ...]:
        # Read once per load: each request checks its voice against them, on
        # the event loop, where a folder scan a request is a stall on a slow disk.
        return tuple(folder_voices(self.spec.path))

    def synthesis_kwargs(self, voice: str | None, speed: float) -> dict[str, Any]:
        """What mlx-audio's ``generate`` is handed besides the text."""
        kwargs: dict[str, Any] = {}
        voices = self.voices()
        if voices != ["default"]:
            if voice not in voices:
                raise BadRequest(f"`{self.name}` has no voice {voice!r}; its voices are {', '.join(voices)}",
                                 param="voice")
            kwargs["voice"] = voice
        if speed != 1.0:
            # Asked only here: inspecting the signature took about 45 us, on every request.
            if "speed" not in inspect.signature(self.model.generate).parameters:
                raise BadRequest(f"`{self.name}` speaks at one speed; leave `speed` out or at 1.0",
                                 param="speed")
            kwargs["speed"] = speed
        return kwargs

    def synthesise(self, text: str, voice: str | None = None, speed: float = 1.0,
                   request_id: str = "") -> AsyncIterator[np.ndarray]:
        """The audio, as float32 chunks in the order mlx-audio makes them."""
        kwargs = self.synthesis_kwargs(voice, speed)
        return self._stepped(speech_chunks(self.model, text, kwargs), request_id)


def speech_chunks(model: Any, text: str, kwargs: dict[str, Any]) -> Iterator[Any]:
    """Worker thread: each result of mlx-audio's ``generate`` as samples;
    Soprano a token a turn and a sentence a chunk (``audio_soprano``)."""
    from mlxd.engine.audio_soprano import is_soprano, sentences

    if is_soprano(model) and not kwargs:
        yield from sentences(model, text)
        return
    for result in model.generate(text, **kwargs):
        yield to_numpy(result.audio).astype(np.float32, copy=False).reshape(-1)


async def load_transcription_engine(spec: ModelSpec, worker: MlxWorker, *,
                                    cache_dir: Path | None = None) -> TranscriptionEngine:
    model, load_bytes, seconds, warmup = await load_on_worker(worker, _loader("stt"), spec, _discard)
    return TranscriptionEngine(spec, worker, model, load_bytes=load_bytes, load_seconds=seconds, warmup=warmup)


async def load_speech_engine(spec: ModelSpec, worker: MlxWorker, *, cache_dir: Path | None = None) -> SpeechEngine:
    model, load_bytes, seconds, warmup = await load_on_worker(worker, _loader("tts"), spec, _discard)
    return SpeechEngine(spec, worker, model, load_bytes=load_bytes, load_seconds=seconds, warmup=warmup)


def _loader(category: str) -> Any:
    def load(spec: ModelSpec) -> tuple[Any, int, float, WarmupReport]:
        """Worker thread: mlx-audio's own loader, measured, and the warm-up."""
        def run() -> Any:
            if category == "stt":
                from mlx_audio.stt.utils import load_model
            else:
                from mlx_audio.tts.utils import load_model
            return load_model(Path(spec.path))

        done = measured_load(spec, run, memory.release_memory)
        warmup = _warm_up(category, done.result, spec)
        return done.result, done.load_bytes, done.load_seconds, warmup

    return load


# Whisper's warm-up: greedy (a request's first attempt) and a few tokens,
# which random weights would otherwise run to the limit; then the fallback
# ladder's temperatures, where the kernel cache lacks them (whisper_ladder.py).
WARM_WHISPER = {"temperature": 0.0, "sample_len": 8}


def _warm_up(category: str, model: Any, spec: ModelSpec) -> WarmupReport:
    """Worker thread: half a second of silence transcribed, or a word
    spoken (``warm_after_load``). With an empty kernel cache the tiny speech
    model's first request took 2.1 s against 0.1 s on this CPU, the tiny
    Whisper's 10.0 s against 4.1 s."""
    def warm() -> None:
        if category == "stt":
            whisper = hasattr(model, "get_tokenizer")
            kwargs = WARM_WHISPER if whisper else {}
            model.generate(np.zeros(SAMPLE_RATE // 2, dtype=np.float32), **_accepted(model.generate, kwargs))
            if whisper:
                warm_ladder(model, spec.name, Path(spec.path))
            return
        voices = folder_voices(spec.path)
        for _ in speech_chunks(model, "Hello.", {} if voices == ["default"] else {"voice": voices[0]}):
            pass

    return warm_after_load(spec, warm)


def _discard(loaded: tuple[Any, int, float, WarmupReport]) -> None:
    del loaded
    memory.release_memory()
