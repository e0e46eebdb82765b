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
cache may be half-built.

A model with ``max_concurrency`` above 1 serves its requests through one
continuous batch instead (``engine/batch.py``); this module then only
validates and tokenizes them. ``max_concurrency: 1`` and models with a
quantised KV cache (``kv_bits``, which mlx-lm cannot batch) keep the path above.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from mlxd.engine import memory, sampling
from mlxd.engine.batch import BatchScheduler
from mlxd.engine.lifecycle import EngineBase, GenerationControl, relay
from mlxd.engine.prefix_cache import PrefixCache
from mlxd.engine.stops import StopMatcher
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.errors import BadRequest, ServiceUnavailable
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.grammar.processor import GrammarProcessor
from mlxd.registry.model import ModelSpec
from mlxd.tools import formats as tool_formats

log = logging.getLogger(__name__)

# Prompt tokens always left for stream_generate after our own chunked prefill:
# mlx-lm's repetition and presence penalties look back 20 tokens, and they only
# see the tokens stream_generate itself processed.
_PENALTY_CONTEXT = 32
# mlx-lm's default group size for a quantised KV cache (stream_generate's too).
_KV_GROUP_SIZE = 64


@dataclass
class LoadedText:
    """What the worker hands back from a load: the model and what it cost."""

    model: Any
    tokenizer: Any
    load_bytes: int
    load_seconds: float
    # Whether mlx-lm's BatchGenerator can batch this model's KV cache layers.
    batchable: bool = False


@dataclass
class Prepared:
    tokens: list[int]
    max_tokens: int
    sampler: Any
    processors: list[Any]
    stops: StopMatcher
    # Prompt tokens left for stream_generate even on a prefix cache hit.
    keep: int = 1


class TextEngine(EngineBase):
    """A loaded mlx-lm model implementing ``mlxd.engine.types.Engine``."""

    kind = "text"

    def __init__(
        self,
        spec: ModelSpec,
        worker: MlxWorker,
        loaded: LoadedText,
        *,
        prefill_chunk: int = 512,
    ) -> None:
        super().__init__(spec, worker, load_bytes=loaded.load_bytes, load_seconds=loaded.load_seconds)
        self._model: Any = loaded.model
        self._tokenizer: Any = loaded.tokenizer
        self._vocab_size = _vocab_size(loaded.model, loaded.tokenizer)
        self._prefill_chunk = max(1, prefill_chunk)
        self.grammars = GrammarCompiler(loaded.tokenizer, self._vocab_size)
        # How this model writes tool calls (None: it has no format mlxd knows).
        self.tool_format = tool_formats.resolve(loaded.tokenizer, spec.tool_parser)
        self.prefix_cache: PrefixCache | None = (
            PrefixCache(spec.prefix_cache.max_bytes) if spec.prefix_cache.max_bytes > 0 else None
        )
        # Set by the loader when the cache is saved to and restored from disk
        # (a ``cache_store.PrefixCachePersistence``).
        self.persistence: Any = None
        self._batch: BatchScheduler | None = None
        if spec.max_concurrency > 1 and spec.kv_bits is None and loaded.batchable:
            self._batch = BatchScheduler(
                self, worker, max_batch=spec.max_concurrency, prefill_chunk=self._prefill_chunk
            )

    def _open(self, request: GenerationRequest, control: GenerationControl) -> AsyncIterator[Any]:
        if self._batch is not None:
            return self._batch.generate(request, control)
        return super()._open(request, control)

    async def save_prefix_cache(self) -> None:
        """Save the prefix cache to disk (before an unload). Never raises."""
        if self.persistence is not None and not self._closed:
            await self.persistence.save()

    def _busy(self) -> bool:
        return self.counts.running > 0 or (self._batch is not None and self._batch.alive)

    def stats(self) -> dict[str, Any]:
        counts, batch = self.counts, self._batch
        return {
            "kind": self.kind,
            "in_flight": len(self._in_flight),
            "running": counts.running,
            "generations": counts.generations,
            "prompt_tokens": counts.prompt_tokens,
            "tokens_generated": counts.tokens_generated,
            "aborted": counts.aborted,
            # Continuous batching (max_concurrency > 1): sequences decoding in
            # the batch now, and how many batched decode steps ran so far.
            "batching": batch is not None,
            "batch_size": batch.size if batch else 0,
            "batched_steps": batch.steps if batch else 0,
            "load_bytes": self.load_bytes,
            "peak_bytes": self.peak_bytes,
            "measured_bytes": self.measured_bytes,
            "load_seconds": round(self.load_seconds, 3),
            "closed": self._closed,
            "prefix_cache": self.prefix_cache_stats(),
        }

    def prefix_cache_stats(self) -> dict[str, Any]:
        cache, saved = self.prefix_cache, getattr(self.persistence, "stats", None)
        entries = cache.entries if cache else 0
        nbytes = cache.nbytes if cache else 0
        return {
            "memory_entries": entries,
            "memory_bytes": nbytes,
            "max_bytes": cache.max_bytes if cache else 0,
            "disk_entries": saved.disk_entries if saved else None,
            "disk_bytes": saved.disk_bytes if saved else None,
            "hits": cache.hits if cache else 0,
            "misses": cache.misses if cache else 0,
            "tokens_reused": cache.tokens_reused if cache else 0,
            "restored_entries": saved.restored_entries if saved else 0,
            "last_save_seconds": saved.last_save_seconds if saved else None,
            "last_restore_seconds": saved.last_restore_seconds if saved else None,
        }

    # ------------------------------------------------------ worker thread
    def _release(self) -> dict[str, Any]:
        self._model = None
        self._tokenizer = None
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return memory.release_memory()

    def _forget(self) -> None:
        self._model = None
        self._tokenizer = None

    def model_and_tokenizer(self) -> tuple[Any, Any]:
        """The loaded model and tokenizer (worker thread); raises once unloaded."""
        model, tokenizer = self._model, self._tokenizer
        if model is None or tokenizer is None:
            raise ServiceUnavailable(f"The model `{self.name}` was unloaded; retry the request.")
        return model, tokenizer

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as token ids (chat template applied). Worker thread."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            raise ServiceUnavailable(f"The model `{self.name}` was unloaded; retry the request.")
        if (request.prompt is None) == (request.messages is None):
            raise BadRequest("Give exactly one of `prompt` and `messages`.", param="messages")
        if request.messages is not None:
            return _render_chat(tokenizer, request.messages, request.tools)
        prompt = request.prompt or ""
        # As mlx-lm does: add BOS unless the prompt already starts with it.
        bos = tokenizer.bos_token
        tokens = tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
        return list(tokens)

    def _run(self, request: GenerationRequest, control: GenerationControl) -> Iterator[Any]:
        if control.abort_reason is not None:
            # Aborted while queued: end without touching the model (it may be
            # about to be released).
            self.counts.aborted += 1
            yield GenerationChunk(text="", finish_reason="abort")
            return
        model, tokenizer = self.model_and_tokenizer()
        counts = self.counts
        counts.running += 1
        counts.generations += 1
        try:
            prepared = self.prepare(request, control)
            others = self.begin_peak_measure()
            try:
                yield from self._decode(model, tokenizer, prepared, control)
            finally:
                self.end_peak_measure(others)
        finally:
            counts.running -= 1
            counts.prompt_tokens += control.prompt_tokens
            counts.tokens_generated += control.completion_tokens

    def prepare(self, request: GenerationRequest, control: GenerationControl) -> Prepared:
        """Validate and tokenize: everything that can fail before the model runs."""
        if request.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        tokens = self.prompt_tokens(request)
        param = "messages" if request.messages is not None else "prompt"
        n_prompt = len(tokens)
        if n_prompt == 0:
            raise BadRequest("The prompt is empty.", param=param)
        limit = self.spec.max_context
        if n_prompt > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens, but the "
                f"prompt has {n_prompt} tokens. Shorten the {param}.",
                param=param,
                code="context_length_exceeded",
            )
        control.prompt_tokens = n_prompt
        penalties = request.sampling.repetition_penalty != 1.0 or bool(request.sampling.presence_penalty)
        return Prepared(
            tokens=tokens,
            # The KV cache was budgeted for max_context tokens: never decode past it.
            max_tokens=min(request.max_tokens, max(1, limit - n_prompt)),
            sampler=sampling.make_sampler(request.sampling, self._vocab_size),
            processors=self._processors(request),
            stops=StopMatcher(request.stop),
            # Penalties look back over tokens stream_generate itself processed:
            # give it as many as on a cold start, so the output is the same.
            keep=_PENALTY_CONTEXT if penalties else 1,
        )

    def _processors(self, request: GenerationRequest) -> list[Any]:
        processors = sampling.make_logits_processors(request.sampling)
        if request.ignore_eos:
            eos = set(getattr(self._tokenizer, "eos_token_ids", None) or ())
            processors.append(sampling.suppress_tokens(eos, self._vocab_size))
        if request.constraint is not None:
            # Last, so that no later processor can revive a masked token.
            grammars = self.grammars
            matcher = grammars.matcher(request.constraint)
            processors.append(GrammarProcessor(matcher, self._vocab_size, grammars.eos_token_ids))
        return processors

    def _decode(
        self, model: Any, tokenizer: Any, prepared: Prepared, control: GenerationControl
    ) -> Iterator[Any]:
        import mlx.core as mx
        from mlx_lm.generate import generation_stream, maybe_quantize_kv_cache, stream_generate
        from mlx_lm.models.cache import make_prompt_cache

        n_prompt = len(prepared.tokens)
        stops = prepared.stops
        prefix = self.prefix_cache
        cache, reused = prefix.fetch(prepared.tokens, prepared.keep) if prefix else (None, 0)
        if cache is None:
            cache = make_prompt_cache(model)
        generated: list[int] = []

        def chunk(text: str, finish: str | None = None) -> GenerationChunk:
            if finish == "abort":
                self.counts.aborted += 1
            return GenerationChunk(
                text=text,
                finish_reason=finish,
                prompt_tokens=n_prompt,
                completion_tokens=control.completion_tokens,
                cached_tokens=reused,
            )

        # The footprint estimate assumes a quantised KV cache from the first token.
        kv_bits = self.spec.kv_bits
        kv_options = {"kv_bits": kv_bits, "quantized_kv_start": 0} if kv_bits else {}
        prompt = mx.array(prepared.tokens)
        done = reused
        step = self._prefill_chunk
        while n_prompt - done > step + _PENALTY_CONTEXT:
            if control.abort_reason is not None:
                yield chunk("", "abort")
                return
            with mx.stream(generation_stream):
                model(prompt[done : done + step][None], cache=cache)
                maybe_quantize_kv_cache(cache, 0, _KV_GROUP_SIZE, kv_bits)
                mx.eval([c.state for c in cache])
            done += step
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
            **kv_options,
        )

        yield from relay(
            responses, control, stops, chunk,
            on_token=lambda response: generated.append(response.token),
            on_finish=lambda: self.keep_prefix(prepared.tokens + generated, cache),
        )

    def keep_prefix(self, tokens: list[int], cache: list[Any]) -> None:
        """Keep a finished generation's KV cache for the next turn (worker thread)."""
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.insert(tokens, cache)
        except Exception:  # the answer is complete: a cache problem must not fail it
            log.exception("keeping the prefix cache of a %s generation failed", self.name)


def _vocab_size(model: Any, tokenizer: Any) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    return int(getattr(tokenizer, "vocab_size", 0) or 0)


def _render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> list[int]:
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        TemplateError = ValueError  # type: ignore[misc,assignment]  # noqa: N806
    if not getattr(tokenizer, "has_chat_template", True):
        raise BadRequest(
            "This model has no chat template; send a raw prompt to /v1/completions instead.",
            param="messages",
        )
    flat = [_flatten_message(m) for m in messages]
    try:
        tokens = tokenizer.apply_chat_template(flat, tools=tools or None, add_generation_prompt=True)
    except TemplateError as exc:
        # Templates raise their own messages ("roles must alternate ..."),
        # written for the person sending the conversation.
        raise BadRequest(f"The chat template rejected the messages: {exc}", param="messages") from exc
    return list(tokens)


def _flatten_message(message: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI message with its content as one string (as mlx-lm's server does)."""
    import json

    if not isinstance(message, dict):
        raise BadRequest("Each message must be an object.", param="messages")
    flat = dict(message)
    content = flat.get("content")
    if content is None:
        flat["content"] = ""
    elif isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"This is a text model; message content of type `{kind}` is not supported.",
                    param="messages",
                )
            texts.append(str(part.get("text", "")))
        flat["content"] = "".join(texts)
    elif not isinstance(content, str):
        raise BadRequest("Message content must be a string or a list of parts.", param="messages")
    tool_calls = flat.get("tool_calls")
    if tool_calls:
        # Chat templates expect tool arguments as objects, the API sends JSON text.
        calls = []
        for call in tool_calls:
            call = dict(call)
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise BadRequest(
                        "tool_calls[].function.arguments is not valid JSON.", param="messages"
                    ) from exc
            call["function"] = function
            calls.append(call)
        flat["tool_calls"] = calls
    return flat
