"""The mlx-lm text engine: prompts in, streamed text chunks out.

A generation is a synchronous generator stepped on the shared worker thread,
one token per step (see ``engine/worker.py``). Everything per token — the
model step, detokenising, stop strings — happens there; the event loop only
receives finished ``GenerationChunk`` objects.

Long prompts are prefilled in chunks of ``prefill_chunk`` tokens, one chunk
per worker step, so a long prompt neither stalls other models' decoding for
its whole prefill nor delays an abort or a disconnect until it is done. The
last part of the prompt (and the decoding) goes through
``mlx_lm.stream_generate``, which owns sampling, EOS handling and the
streaming detokenizer (it never emits half a UTF-8 character).

The prefix cache (``engine/prefix_cache.py``): a request starts from a copy
of the longest cached prefix of its prompt and prefills only the rest; when
it finishes normally, its cache (prompt plus reply) is kept for the next
turn. An aborted, cancelled or failed generation never inserts anything: its
cache may be half-built. Where the chat template moves part of the prompt
with each new user turn (Mistral's tool list), the next prompt's known part is
prefilled in the background after a chat answer and kept too
(``engine/next_turn_background.py``).

A model with ``max_concurrency`` above 1 serves its requests through one
continuous batch instead (``engine/batch.py``). ``max_concurrency: 1`` and
models with a quantised KV cache (``kv_bits``, which mlx-lm cannot batch)
keep the path above. Both paths share the model holder (``TextModel`` in
``engine/text_model.py``: the model, the tokenizer and request preparation),
the counts, the peak measurement and the prefix cache; the batch is handed
those, not the engine.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from mlxd.engine import memory
from mlxd.engine.batch import BatchScheduler
from mlxd.engine.checkpoints import checkpoint, plan
from mlxd.engine.cache_explain import CacheExplainer
from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.lifecycle import EngineBase, GenerationControl, relay
from mlxd.engine.local_output import LocalOutput
from mlxd.engine.logprobs import token_logprob
from mlxd.engine.next_turn_background import NextTurnPrefill
from mlxd.engine.prefix_cache import PrefixCache
from mlxd.engine.reasoning_budget import observe
from mlxd.engine.speculation import Speculation
from mlxd.engine.text_model import PENALTY_CONTEXT, LoadedText, Prepared, TextModel, feed, quantize_kv
from mlxd.engine.types import GenerationChunk, GenerationRequest, PromptCapture, SavedCache
from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.registry.model import ModelSpec
from mlxd.tools.output_request import OutputRequest

if TYPE_CHECKING:
    from mlxd.engine.cache_store.folder import CacheStore
    from mlxd.engine.cache_store.persistence import PrefixCachePersistence
    from mlxd.engine.warmup_background import BackgroundWarmup

log = logging.getLogger(__name__)


class TextEngine(EngineBase, GenerationEngine):
    """A loaded mlx-lm model: ``mlxd.engine.contract.GenerationEngine``."""

    kind = "text"
    # Its model runs here: images (none, for text) would be decoded here.
    wants_image_urls = False

    def __init__(
        self,
        spec: ModelSpec,
        worker: MlxWorker,
        loaded: LoadedText,
        *,
        prefill_chunk: int = 512,
    ) -> None:
        super().__init__(spec, worker, load_bytes=loaded.load_bytes, load_seconds=loaded.load_seconds)
        self.model = TextModel(
            spec.name, loaded.model, loaded.tokenizer, spec.max_context, spec.tool_parser, spec.reasoning_parser,
            checkpoints=loaded.checkpoints and spec.prefix_cache.max_bytes > 0,
        )
        # The model's grammar compiler, tool-call format, reasoning markers
        # and vocabulary size (a ``logit_bias`` names ids 0 to vocab_size - 1).
        self.grammars = self.model.grammars
        self.tool_format = self.model.tool_format
        self.reasoning_format = self.model.reasoning_format
        self.vocab_size = self.model.vocab_size
        self.output = LocalOutput(self.tool_format, self.reasoning_format, self.grammars, self.vocab_size)
        self._prefill_chunk = max(1, prefill_chunk)
        self.prefix_cache: PrefixCache | None = (
            PrefixCache(spec.prefix_cache.max_bytes) if spec.prefix_cache.max_bytes > 0 else None
        )
        # Set by the loader when the cache is saved to and restored from disk.
        self.persistence: PrefixCachePersistence | None = None
        # Set by the loader: the cache folder this engine holds in use until it closes.
        self.cache_store: CacheStore | None = None
        # Explains captured requests' prefix-cache decisions.
        self._explainer = CacheExplainer()
        # ``warmup`` (EngineBase) is set by the loader: how the warm-up went
        # (or, in the background, that it is under way).
        # Set by the loader when the warm-up runs after the hand-over.
        self.background_warmup: BackgroundWarmup | None = None
        # Between-turn prefills (engine/next_turn_background.py).
        self.next_turn = NextTurnPrefill(self, worker, spec.prefix_cache.next_turn, prefill_chunk=self._prefill_chunk)
        self._batch: BatchScheduler | None = None
        # Speculative decoding runs in the batch, a batch of one included.
        self.speculation: Speculation | None = None
        if spec.speculative is not None:
            self.speculation = Speculation(spec.speculative, loaded.draft, prefill_chunk=self._prefill_chunk,
                                           unsupported=_unspeculative(spec, loaded))
        speculates = self.speculation is not None and self.speculation.usable
        if (spec.max_concurrency > 1 or speculates) and spec.kv_bits is None and loaded.batchable:
            self._batch = BatchScheduler(
                spec.name, worker, self.model, self.counts, self.peak, self.prefix_cache,
                max_batch=spec.max_concurrency, prefill_chunk=self._prefill_chunk,
                speculation=self.speculation,
            )

    @property
    def batching(self) -> bool:
        """Continuous batching (max_concurrency > 1, or speculation)."""
        return self._batch is not None

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        return await self.output.settle(requests, output, name)

    def _open(self, request: GenerationRequest, control: GenerationControl) -> AsyncIterator[Any]:
        if self._batch is not None:
            source = self._batch.generate(request, control)
        else:
            source = super()._open(request, control)
        if not self.next_turn.watches(request):
            return source
        return self._then_next_turn(source, request, control)

    async def _then_next_turn(
        self, source: AsyncIterator[Any], request: GenerationRequest, control: GenerationControl
    ) -> AsyncIterator[Any]:
        """``source``'s chunks; the answer's text, once it has ended, starts
        the next turn's prefill (before the last chunk goes out: a consumer
        may close us as soon as it has it)."""
        text: list[str] = []
        # Taken before the source runs, so before its lookup: a clear after
        # it removed this answer's history, which its next turn must not
        # prefill back.
        since = self.prefix_cache.clears if self.prefix_cache is not None else 0
        try:
            async for chunk in source:
                text.append(chunk.text)
                if chunk.finish_reason is not None:
                    self.next_turn.after(request, control, "".join(text), chunk.finish_reason, since)
                yield chunk
        finally:
            closer = getattr(source, "aclose", None)
            if closer is not None:
                await closer()

    async def close(self) -> None:
        try:
            await self.next_turn.cancel()
            if self.background_warmup is not None:
                await self.background_warmup.cancel()
            await super().close()
        finally:
            if self.cache_store is not None:
                self.cache_store.release()

    async def before_unload(self) -> SavedCache | None:
        """Save the prefix cache to disk. Never raises."""
        persistence = self.persistence
        if persistence is None or self._closed:
            return None
        await persistence.save()
        return SavedCache(persistence.store.root, persistence.fingerprint)

    async def clear_prefix_cache(self) -> bool:
        """Forget the cache in memory and its saved copy on disk, which the
        next load would otherwise restore."""
        cache = self.prefix_cache
        if cache is None or self._closed:
            return False
        # A between-turn prefill queued behind the clear would prefill the
        # cleared conversation again and keep it: it stops first.
        await self.next_turn.cancel()
        # The cache is the worker's: cleared between two of its steps.
        await self._worker.call(cache.clear)
        if self.persistence is not None:
            await self.persistence.clear()
        return True

    async def _before_worker(self, request: GenerationRequest, control: GenerationControl) -> None:
        # Tokenizing needs no MLX: a long prompt tokenized on the worker would
        # stall every other model's decoding for as long as it takes.
        control.prompt_ids, control.prompt_boundaries = await self.model.tokenize(request)
        control.opens_reasoning = self.model.opens_reasoning(request, control.prompt_ids)
        if request.capture is not None:
            await self._capture(request.capture, control.prompt_ids)

    async def _capture(self, capture: PromptCapture, tokens: list[int]) -> None:
        """A captured request (opt-in): its templated prompt, and why the
        prefix cache did or did not serve it, read just before it queues."""
        _, tokenizer = self.model.get()
        keys = await self._worker.call(self.prefix_cache.entry_keys) if self.prefix_cache is not None else None
        decode = tokenizer.decode
        text = await asyncio.to_thread(decode, tokens)
        decision = None
        if keys is not None:
            decision = await asyncio.to_thread(self._explainer.explain, tokens, keys, decode)
        capture.prompt(text, len(tokens), decision)

    def _busy(self) -> bool:
        return (self.counts.running > 0 or (self._batch is not None and self._batch.alive)
                or self.next_turn.running)

    def stats(self) -> dict[str, Any]:
        batch = self._batch
        return {
            **super().stats(),
            # Continuous batching (max_concurrency > 1): sequences decoding in
            # the batch now, and how many batched decode steps ran so far.
            "batching": self.batching,
            "batch_size": batch.size if batch else 0,
            "batched_steps": batch.steps if batch else 0,
            "speculative": self.speculation.status() if self.speculation is not None else None,
            "prefix_cache": self.prefix_cache_stats(),
        }

    def prefix_cache_stats(self) -> dict[str, Any]:
        cache = self.prefix_cache
        saved = self.persistence.stats if self.persistence is not None else None
        entries = cache.entries if cache else 0
        nbytes = cache.nbytes if cache else 0
        return {
            "memory_entries": entries,
            "memory_bytes": nbytes,
            "checkpoint_entries": cache.checkpoint_entries if cache else 0,
            "checkpoint_bytes": cache.checkpoint_bytes if cache else 0,
            "max_bytes": cache.max_bytes if cache else 0,
            "disk_entries": saved.disk_entries if saved else None,
            "disk_bytes": saved.disk_bytes if saved else None,
            "hits": cache.hits if cache else 0,
            "misses": cache.misses if cache else 0,
            "tokens_reused": cache.tokens_reused if cache else 0,
            # Between-turn prefills that kept an entry, and the tokens they prefilled.
            "next_turn_prefills": self.next_turn.prefills,
            "next_turn_tokens": self.next_turn.tokens,
            "restored_entries": saved.restored_entries if saved else 0,
            "recompute_entries": saved.recompute_entries if saved else 0,
            "last_save_seconds": saved.last_save_seconds if saved else None,
            "last_restore_seconds": saved.last_restore_seconds if saved else None,
        }

    # ------------------------------------------------------ worker thread
    def _release(self) -> dict[str, Any]:
        self.model.drop()
        if self.speculation is not None:
            self.speculation.drop()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return memory.release_memory()

    def _forget(self) -> None:
        self.model.drop()
        if self.speculation is not None:
            self.speculation.drop()

    def _run(self, request: GenerationRequest, control: GenerationControl) -> Iterator[Any]:
        if control.abort_reason is not None:
            # Aborted while queued: end without touching the model (it may be
            # about to be released).
            self.counts.abort(control)
            yield GenerationChunk(text="", finish_reason="abort")
            return
        model, tokenizer = self.model.get()
        with self.counts.generation(control):
            prepared = self.model.prepare(request, control)
            with self.peak.measure():
                yield from self._decode(model, tokenizer, prepared, control)

    def _decode(
        self, model: Any, tokenizer: Any, prepared: Prepared, control: GenerationControl
    ) -> Iterator[Any]:
        import mlx.core as mx
        from mlx_lm.generate import stream_generate
        from mlx_lm.models.cache import make_prompt_cache

        n_prompt = len(prepared.tokens)
        stops = prepared.stops
        # A warm-up leaves the user's cache as it found it: no lookup, no entry.
        prefix = None if control.warmup else self.prefix_cache
        since = prefix.clears if prefix else 0
        cache, reused = prefix.fetch(prepared.tokens, prepared.keep) if prefix else (None, 0)
        if cache is None:
            cache = make_prompt_cache(model)
        generated: list[int] = []
        scored: list[Any] = []

        def on_token(response: Any) -> None:
            generated.append(response.token)
            observe(prepared.reasoning, response.token)
            if prepared.logprobs is not None and response.finish_reason != "stop":
                scored.append(token_logprob(tokenizer, response.token, response.logprobs, prepared.logprobs))

        def chunk(text: str, finish: str | None = None) -> GenerationChunk:
            if finish == "abort":
                self.counts.abort(control)
            entries = scored[:] if prepared.logprobs is not None else None
            scored.clear()
            return GenerationChunk(
                text=text,
                finish_reason=finish,
                prompt_tokens=n_prompt,
                completion_tokens=control.completion_tokens,
                cached_tokens=reused,
                logprobs=entries,
                reasoning_tokens=prepared.reasoning_tokens(control.completion_tokens) if finish else None,
            )

        # The footprint estimate assumes a quantised KV cache from the first
        # token: quantised here, not by mlx-lm (``quantize_kv`` says why).
        kv_bits = self.spec.kv_bits
        quantize_kv(cache, kv_bits)
        prompt = mx.array(prepared.tokens)
        done = reused
        step = self._prefill_chunk
        # Checkpoints of a cache that cannot be trimmed (engine/checkpoints.py).
        marks = collections.deque(plan(prepared.boundaries, n_prompt, prepared.keep, reused) if prefix else ())
        while marks or n_prompt - done > step + PENALTY_CONTEXT:
            if control.abort_reason is not None:
                yield chunk("", "abort")
                return
            upto = min(done + step, marks[0].position) if marks else done + step
            feed(model, prompt[done:upto], cache, kv_bits)
            done = upto
            if marks and marks[0].position == done:
                checkpoint(prefix, prepared.tokens[:done], cache, marks.popleft().kind, self.name, since)
            yield SKIP

        responses = stream_generate(
            model,
            tokenizer,
            prompt[done:],
            max_tokens=prepared.max_tokens,
            sampler=prepared.sampler,
            logits_processors=prepared.processors or None,
            prompt_cache=cache,
            prefill_step_size=step,
        )

        def keep() -> None:
            if prefix is not None:
                prefix.keep(prepared.tokens + generated, cache, self.name, since=since)

        yield from relay(
            responses, control, stops, chunk,
            on_token=on_token,
            on_finish=keep,
            pace=self._worker.pace,
        )


def _unspeculative(spec: ModelSpec, loaded: LoadedText) -> str | None:
    """Why this engine decodes without speculation although its entry asks for it."""
    if loaded.unspeculative is not None:
        return loaded.unspeculative
    if spec.kv_bits is not None:
        return "a quantised KV cache (kv_bits) is not batched, and speculation runs in the batch"
    if not loaded.batchable:
        return "mlx-lm cannot batch this model's cache, and speculation runs in the batch"
    return None
