"""The engine of ``kind: embedding`` and ``kind: rerank`` models.

A request's inputs are tokenized (on the event loop when short, in a thread
when long: the ``tokenizers`` library runs outside the GIL), then queued in
the batching core (``mlxd.engine.embedding_batch``) with every other
request's. One pump per engine takes batch after batch from it and runs each
as one turn of the MLX worker's ring (``MlxWorker.turn``): a forward pass
takes its turn like one decode step of a chat stream, so embedding work
and generation share the machine in turns, and a long queue of embeddings
never holds a chat stream back for more than one batch (bounded by
``batch_tokens``). While another model decodes, a pass is not even waited
for in its turn: it is queued on the device, and read back in the pump's
next turn, which queues the next one (``_pump_batches``). On CUDA the passes
after the first run on a thread of their own instead (``passes_on_own_thread``).

Residency sees an ordinary engine: a footprint (the load, raised to the
first batch's peak), ``close`` that waits for the batch in flight,
``abort_all`` that fails the requests still queued, figures for status.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlxd.engine import memory
from mlxd.engine.embedding_batch import Batch, BatchQueue
from mlxd.engine.embedding_model import Encoded, LoadedEncoder, TextTokenizer, is_cross_encoder
from mlxd.engine.host_arrays import to_numpy
from mlxd.engine.lifecycle import EngineBase, load_on_worker, measured_load, warm_after_load
from mlxd.engine.rerank_llm import LoadedLlmReranker, PromptTokenizer
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.engine.warmup import WarmupReport
from mlxd.engine.worker import MlxWorker
from mlxd.errors import BadRequest, MlxdError, ModelPreempted, ModelUnloaded
from mlxd.registry.model import ModelSpec

log = logging.getLogger(__name__)

ENCODER_KINDS = ("embedding", "rerank")

# Inputs up to this many characters are tokenized on the event loop (tens to
# hundreds of microseconds): handing them to a thread and back cost more than
# that, in two GIL hand-offs per request; longer ones go to a thread.
INLINE_CHARS = 16_384


@dataclass
class EncoderFigures:
    """For status and /metrics: what the batching did. Event loop only."""

    requests: int = 0
    inputs: int = 0
    batches: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    truncated: int = 0
    # The forward passes' time on the MLX worker: set against a request's
    # whole time (mlxd_request_seconds), what the path adds around the model.
    pass_seconds: float = 0.0
    # What passes waited for a decoding model's pace (engine/generation_pace.py).
    paced_seconds: float = 0.0


class EncoderEngine(EngineBase):
    """An embedding model (``embed``) or a cross-encoder (``rerank``)."""

    def __init__(self, spec: ModelSpec, worker: MlxWorker, encoder: LoadedEncoder | LoadedLlmReranker,
                 tokenizer: TextTokenizer | PromptTokenizer,
                 *, load_bytes: int, load_seconds: float, pass_thread: bool = False,
                 warmup: WarmupReport | None = None) -> None:
        super().__init__(spec, worker, load_bytes=load_bytes, load_seconds=load_seconds, warmup=warmup)
        # ``pass_thread``: the passes after the first run on a thread of
        # their own (``passes_on_own_thread``); the load, the first pass
        # (whose peak is measured) and the release stay on the worker.
        self._pass_thread = MlxWorker(name=f"mlx-passes:{spec.name}").start() if pass_thread else None
        self.kind = spec.kind
        self.encoder: LoadedEncoder | LoadedLlmReranker | None = encoder
        self.tokenizer = tokenizer
        self.figures = EncoderFigures()
        self._queue = BatchQueue(max_tokens=spec.batch_tokens)
        self._waiting: dict[int, asyncio.Future[list[Any]]] = {}
        self._keys = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self._forwarding = False
        # A pass queued on the device and not read back yet, with its batch (``_pump_batches``).
        self._ahead: tuple[Batch, Any] | None = None

    # --- what a request asks ---------------------------------------------------

    @property
    def dimensions(self) -> int:
        return self.encoder.dimensions if self.encoder is not None else 0

    @property
    def max_length(self) -> int:
        return self.tokenizer.max_length

    async def encode(self, texts: Sequence[str] | None = None, arrays: Sequence[Sequence[int]] | None = None,
                     *, truncate: bool) -> Encoded:
        """Texts or token arrays -> token ids, cut at the model's length when
        ``truncate``; otherwise an input that does not fit is a 400."""
        if arrays is not None:
            self._check_ids(arrays)
            encoded = self.tokenizer.token_arrays(arrays)
        else:
            texts = list(texts or ())
            encoded = await _off_loop(self.tokenizer.texts, sum(map(len, texts)), texts)
        self._check_truncation(encoded, truncate, "input")
        return encoded

    async def embed(self, encoded: Encoded, priority: str = "default") -> list[np.ndarray]:
        """One float32 vector per input, in input order; ``priority`` is the
        caller's class, which orders the batch queue (embedding_batch.py)."""
        if self.kind != "embedding":
            raise BadRequest(f"The model `{self.name}` is a {self.kind} model, not an embedding model.",
                             param="model", code="model_not_supported")
        return await self._run(encoded, priority)

    async def rerank(self, query: str, documents: Sequence[str], *, truncate: bool, instruction: str | None = None,
                     priority: str = "default") -> tuple[list[float], int]:
        """Each document's relevance to ``query`` (in document order) and the
        tokens read; ``instruction``: an LLM reranker's task (the registry
        allows it on no other model), None for the model card's."""
        if self.kind != "rerank":
            raise BadRequest(f"The model `{self.name}` is an {self.kind} model, not a rerank model.",
                             param="model", code="model_not_supported")
        chars = len(query) * len(documents) + sum(map(len, documents))
        args: tuple[Any, ...] = (query, list(documents)) if instruction is None else (query, list(documents),
                                                                                      instruction)
        encoded = await _off_loop(self.tokenizer.pairs, chars, *args)
        self._check_truncation(encoded, truncate, "documents")
        scores = await self._run(encoded, priority)
        return [float(s) for s in scores], encoded.tokens

    def _check_ids(self, arrays: Sequence[Sequence[int]]) -> None:
        vocab = self.tokenizer.vocab_size
        for i, ids in enumerate(arrays):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(f"input[{i}] has token id {bad}, outside the vocabulary of `{self.name}` "
                                 f"(0 to {vocab - 1})", param=f"input[{i}]")

    def _check_truncation(self, encoded: Encoded, truncate: bool, field: str) -> None:
        if not encoded.truncated:
            return
        if not truncate:
            i = encoded.truncated[0]
            raise BadRequest(
                f"{field}[{i}] is longer than the {self.max_length} tokens `{self.name}` reads "
                "(this entry has truncate: false)", param=f"{field}[{i}]", code="context_length_exceeded")
        self.figures.truncated += len(encoded.truncated)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        raise BadRequest(f"The model `{self.name}` is a {self.kind} model; it does not generate text "
                         f"(use /v1/{'embeddings' if self.kind == 'embedding' else 'rerank'}).",
                         param="model", code="model_not_supported")

    # --- batching ----------------------------------------------------------------

    async def _run(self, encoded: Encoded, priority: str) -> list[Any]:
        if self._closed:
            raise ModelUnloaded(self.name)
        if not encoded.ids:
            return []
        key = next(self._keys)
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        self._queue.add(key, encoded.ids, encoded.types, priority=priority)
        self._worker.pace.touched(time.perf_counter())
        self.figures.requests += 1
        self.figures.inputs += len(encoded.ids)
        self.figures.tokens += encoded.tokens
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._pump_batches())
        try:
            return await future
        finally:
            # A client that left: its rows still waiting leave the queue.
            if self._waiting.pop(key, None) is not None:
                self._queue.cancel(key)

    async def _pump_batches(self) -> None:
        """Batch after batch, each a worker turn. While another model decodes
        on the worker (a chat stream's steps), a pass is queued on the device
        in one turn and read back in the next, which also queues the
        following batch: the passes run beside the decode steps instead of
        between them. Waited for in its own turn, each pass held back the
        decode step after it by its whole length; on this project's CPU a
        chat stream beside 8 embedding clients then ran at 0.79-0.83x its
        solo tokens/s (bench/chat_beside_embeddings.py)."""
        pace = self._worker.pace
        passing = False  # a pass of this engine run or on the device, told to the pace keeper
        try:
            while (ahead := self._ahead) is not None or len(self._queue):
                # Beside a decoding model, passes keep to its pace (interactive callers' do not).
                waiting = self._queue.most_urgent()
                wait = 0.0 if waiting == 0 else pace.wait_s(time.perf_counter(), waiting)
                if wait > 0 and ahead is None:
                    self.figures.paced_seconds += wait
                    await asyncio.sleep(wait)
                    continue
                # A pass on the device is read back even while held: a held pass starts no other.
                batch = self._queue.take() if wait == 0 else None
                if batch is not None and not passing:
                    pace.began(time.perf_counter())
                    passing = True
                if batch is not None:
                    self.figures.batches += 1
                    self.figures.padded_tokens += batch.padded_tokens
                # The first pass is waited for, on the worker: it measures the model's peak memory.
                apart = self._pass_thread is not None and not self.peak.pending
                beside = not apart and (ahead is not None or (not self.peak.pending and self._worker.open_streams > 0))
                finished = ahead[0] if ahead is not None else (None if beside else batch)
                self._forwarding = True
                try:
                    if beside:
                        done, queued, seconds = await self._worker.turn(
                            lambda a=ahead, b=batch: self._exchange(a, b))
                    else:
                        runner = self._pass_thread if apart else self._worker
                        done, seconds = await runner.turn(lambda b=batch: self._step(b))
                        queued = None
                except Exception as exc:
                    failed = [b for b in (ahead[0] if ahead else None, batch) if b is not None]
                    self._ahead = None
                    if passing:
                        pace.ended(time.perf_counter())
                        passing = False
                    log.exception("a batch of %d inputs on %s failed", sum(len(b.rows) for b in failed), self.name)
                    failure = exc if isinstance(exc, MlxdError) else MlxdError(
                        f"The model `{self.name}` failed on this batch.")
                    for b in failed:
                        for key in self._queue.fail(b):
                            self._settle(key, failure)
                    continue
                finally:
                    self._forwarding = False
                self.figures.pass_seconds += seconds
                if finished is not None:
                    for key, results in self._queue.deliver(finished, done):
                        self._settle(key, results)
                self._ahead = (batch, queued) if beside and batch is not None else None
                if self._ahead is None and passing:
                    pace.ended(time.perf_counter())
                    passing = False
        finally:
            if passing:
                pace.ended(time.perf_counter())
            self._pump = None
            self._ahead = None

    def _settle(self, key: int, value: Any) -> None:
        future = self._waiting.pop(key, None)
        if future is None or future.done():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    def _exchange(self, ahead: tuple[Batch, Any] | None, batch: Batch | None) -> tuple[list[Any], Any, float]:
        """Worker thread: the pass on the device read back (once the device
        has it), and the next one queued, not waited for; and how long the
        turn took."""
        import mlx.core as mx

        started = time.perf_counter()
        done = list(to_numpy(ahead[1])) if ahead is not None else []
        queued = None
        if batch is not None:
            queued = self._pass(batch)
            mx.async_eval(queued)
        return done, queued, time.perf_counter() - started

    def _step(self, batch: Batch) -> tuple[list[Any], float]:
        """Worker thread: the forward pass (its memory peak measured the
        first time) and how long it took."""
        started = time.perf_counter()
        with self.peak.measure():
            out = to_numpy(self._pass(batch))
        return list(out), time.perf_counter() - started

    def _pass(self, batch: Batch) -> Any:
        encoder = self.encoder
        if encoder is None:
            raise ModelUnloaded(self.name)
        return encoder.embed(batch) if self.kind == "embedding" else encoder.score(batch)

    # --- residency's side ------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        f = self.figures
        return {
            **super().stats(),
            "queued_inputs": len(self._queue),
            "requests": f.requests,
            "inputs": f.inputs,
            "batches": f.batches,
            "prompt_tokens": f.tokens,
            "padded_tokens": f.padded_tokens,
            "truncated_inputs": f.truncated,
            "pass_seconds": round(f.pass_seconds, 6),
            "paced_seconds": round(f.paced_seconds, 6),
            "pace": self._worker.pace.snapshot(time.perf_counter()),
            "dimensions": self.dimensions,
            "max_length": self.max_length,
            "pass_thread": self._pass_thread is not None,
        }

    async def abort_all(self, reason: str) -> int:
        """Fail every request still waiting (the batch on the worker finishes)."""
        error: MlxdError = ModelUnloaded(self.name) if reason == "unloaded" else ModelPreempted(
            f"Work on `{self.name}` was interrupted: the model was preempted or the daemon is shutting down")
        keys = list(self._waiting)
        for key in keys:
            self._queue.cancel(key)
            self._settle(key, error)
        return len(keys)

    def _busy(self) -> bool:
        return self._forwarding or self._ahead is not None

    async def close(self) -> None:
        await super().close()
        if self._pass_thread is not None:
            await self._pass_thread.shutdown()

    def _release(self) -> dict[str, Any]:
        self.encoder = None
        memory.release_memory()
        return {}

    def _forget(self) -> None:
        self.encoder = None


async def _off_loop(tokenize: Callable[..., Encoded], chars: int, *args: Any) -> Encoded:
    """``tokenize(*args)``, in a thread when the inputs are long (``INLINE_CHARS``)."""
    if chars <= INLINE_CHARS:
        return tokenize(*args)
    return await asyncio.to_thread(tokenize, *args)


def passes_on_own_thread() -> bool:
    """Whether an encoder's passes run on a thread of their own, beside the
    MLX worker: on CUDA. There the worker's time goes to host work, not to
    waiting for the device: queueing a MiniLM pass (``mx.async_eval``,
    launching its kernels) took 2.1 ms of it on an H100, building it 0.7,
    against 3.7 ms for a whole decode step of SmolLM2, so a chat stream
    beside 8 embedding clients lost up to a quarter of its pace to the
    encoder's turns (docs/embeddings.md). ``mx.async_eval`` lets go of the
    GIL, and MLX (0.31.2 on) evaluates each thread's streams on their own, so
    on a second thread that work runs beside the decode steps'. On a CPU the
    passes' arithmetic would take the decode steps' cores instead, and Metal
    is not measured yet: both keep the passes on the worker."""
    import mlx.core as mx

    return bool(mx.cuda.is_available())


async def load_encoder_engine(spec: ModelSpec, worker: MlxWorker, *, cache_dir: Path | None = None,
                              pass_thread: bool | None = None) -> EncoderEngine:
    """Load ``spec`` (kind embedding or rerank) on the worker; ``cache_dir``
    is the kinds table's common argument: an encoder keeps nothing on disk.
    ``pass_thread`` None: ``passes_on_own_thread()``."""
    loaded = await load_on_worker(worker, _load, spec, _discard)
    encoder, tokenizer, load_bytes, seconds, warmup = loaded
    if pass_thread is None:
        pass_thread = await worker.call(passes_on_own_thread)
    return EncoderEngine(spec, worker, encoder, tokenizer, load_bytes=load_bytes, load_seconds=seconds,
                         pass_thread=pass_thread, warmup=warmup)


def _load(spec: ModelSpec) -> tuple[Any, Any, int, float, WarmupReport]:
    """Worker thread: the model and its tokenizer, what loading them cost and their warm-up."""
    from mlxd.engine.embedding_model import load_cross_encoder, load_embedder
    from mlxd.engine.rerank_llm import load_llm_reranker
    from mlxd.registry.resolve import is_llm_reranker, read_model_config

    def load() -> tuple[Any, Any]:
        if spec.kind != "rerank":
            return load_embedder(spec.path)
        config = read_model_config(spec.path)
        if is_cross_encoder(config):
            return load_cross_encoder(spec.path)
        if is_llm_reranker(config):
            return load_llm_reranker(spec.path)
        raise ValueError("a rerank model must be a *ForSequenceClassification cross-encoder "
                         "or a *ForCausalLM LLM reranker (Qwen3-Reranker)")

    done = measured_load(spec, load, memory.release_memory)
    encoder, tokenizer = done.result
    warmup = _warm_up(spec, encoder, tokenizer)
    return encoder, tokenizer, done.load_bytes, done.load_seconds, warmup


# A warm-up pass's inputs: two lengths, so that the padding's mask is built too.
WARM_TEXTS = ("Warm up.", "The kernels a forward pass needs are compiled before the first request.")


def _warm_up(spec: ModelSpec, encoder: Any, tokenizer: Any) -> WarmupReport:
    """Worker thread: one pass over two short inputs (``warm_after_load``):
    the kernels a fused GELU and the pooling's normalisation compile. With
    an empty kernel cache MiniLM's first request took 0.82 s against 0.02 s
    on this CPU."""
    def warm() -> None:
        if spec.kind == "embedding":
            encoded = tokenizer.texts(list(WARM_TEXTS))
        else:
            encoded = tokenizer.pairs(WARM_TEXTS[0], list(WARM_TEXTS))
        queue = BatchQueue(max_tokens=spec.batch_tokens)
        queue.add(0, encoded.ids, encoded.types)
        batch = queue.take()
        if batch is not None:
            to_numpy(encoder.embed(batch) if spec.kind == "embedding" else encoder.score(batch))

    return warm_after_load(spec, warm)


def _discard(loaded: tuple[Any, Any, int, float, WarmupReport]) -> None:
    loaded[0].model = None
    memory.release_memory()
