"""A loaded mlx-lm model as both text paths use it: the single-sequence path
(``engine/text.py``) and the continuous batch (``engine/batch.py``).

``TextModel`` holds the model and tokenizer until the engine releases them
and turns a request into a ``Prepared`` generation: the prompt's token ids
(``engine/prompt.py``), the bounds, sampler, logits processors and stop
strings — everything that can fail before the model runs. Worker thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mlxd.engine import sampling
from mlxd.engine.checkpoints import Boundary, boundaries
from mlxd.engine.lifecycle import GenerationControl
from mlxd.engine.prompt import check_context, prompt_tokens
from mlxd.engine.reasoning_budget import ReasoningPhase, last_processors, reasoning_phase
from mlxd.engine.stops import StopMatcher
from mlxd.engine.types import GenerationRequest
from mlxd.errors import BadRequest, ModelUnloaded
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.grammar.processor import GrammarProcessor
from mlxd.thread_names import name_this_thread
from mlxd.tools import formats as tool_formats
from mlxd.tools import reasoning as reasoning_formats

# Prompt tokens always left for stream_generate after our own chunked prefill:
# mlx-lm's repetition and presence penalties look back 20 tokens, and they only
# see the tokens stream_generate itself processed.
PENALTY_CONTEXT = 32

T = TypeVar("T")


@dataclass
class LoadedText:
    """What the worker hands back from a load: the model and what it cost."""

    model: Any
    tokenizer: Any
    load_bytes: int
    load_seconds: float
    # Whether mlx-lm's BatchGenerator can batch this model's KV cache layers.
    batchable: bool = False
    # Whether its cache can become untrimmable (sliding windows, SSM state).
    checkpoints: bool = False
    # ``speculative: {method: draft}``: the draft model, loaded with it.
    draft: Any = None
    # Why the model cannot decode speculatively (None: it can, or was not asked to).
    unspeculative: str | None = None


@dataclass
class Prepared:
    tokens: list[int]
    max_tokens: int
    sampler: Any
    processors: list[Any]
    stops: StopMatcher
    # Prompt tokens left for stream_generate even on a prefix cache hit.
    keep: int = 1
    # Alternatives per token when the request wants logprobs (None: it does not).
    logprobs: int | None = None
    # A thinking model's reasoning phase (its token count for usage; None: no markers to follow).
    reasoning: ReasoningPhase | None = None

    def reasoning_tokens(self, completion_tokens: int) -> int | None:
        return self.reasoning.reasoning_tokens(completion_tokens) if self.reasoning is not None else None
    # Where to checkpoint the cache while prefilling (models whose cache
    # cannot always be trimmed; empty for the others).
    boundaries: list[Boundary] = field(default_factory=list)


class TextModel:
    """The model and tokenizer of one engine, until ``drop``. Worker thread."""

    def __init__(
        self, name: str, model: Any, tokenizer: Any, max_context: int, tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        *, checkpoints: bool = False,
    ) -> None:
        self.name = name
        # Whether this model's cache can become untrimmable, so that its
        # prompts are checkpointed at their message boundaries.
        self.checkpoints = checkpoints
        self._model = model
        self._tokenizer = tokenizer
        self.max_context = max_context
        self.vocab_size = _vocab_size(model, tokenizer)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)
        # How this model writes tool calls (None: it has no format mlxd knows).
        self.tool_format = tool_formats.resolve(tokenizer, tool_parser)
        # How it marks its reasoning (None: its answers are all text).
        self.reasoning_format = reasoning_formats.resolve(tokenizer, reasoning_parser)
        # Tokenizing runs on a thread of this model's own (one caller at a
        # time, so a tokenizer never sees two at once) that ends with the
        # model: the Rust tokenizers library keeps per-thread state for every
        # tokenizer that encoded on a thread, freed only when that thread
        # exits. Tokenized on asyncio's long-lived pool threads, each load
        # left ~50 KB behind after its unload (measured, tokenizers 0.23).
        self._tokenize_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tokenize-{name}",
                                                   initializer=name_this_thread)

    def get(self) -> tuple[Any, Any]:
        """The model and tokenizer; raises ``ModelUnloaded`` once dropped."""
        model, tokenizer = self._model, self._tokenizer
        if model is None or tokenizer is None:
            raise ModelUnloaded(self.name)
        return model, tokenizer

    def drop(self) -> None:
        self._model = None
        self._tokenizer = None
        # The thread exits once a running tokenize is done (see __init__).
        self._tokenize_thread.shutdown(wait=False)

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """The request's prompt as this model's token ids (chat template
        applied). Any thread: it uses the tokenizer only, never MLX."""
        _, tokenizer = self.get()
        return prompt_tokens(tokenizer, request)

    def prompt_boundaries(self, request: GenerationRequest, tokens: list[int]) -> list[Boundary]:
        """Where to checkpoint ``tokens`` (none unless this model needs it).
        Any thread: the tokenizer only."""
        if not self.checkpoints:
            return []
        _, tokenizer = self.get()
        return boundaries(tokenizer, request, tokens)

    def _tokens_and_boundaries(self, request: GenerationRequest) -> tuple[list[int], list[Boundary]]:
        tokens = self.prompt_tokens(request)
        return tokens, self.prompt_boundaries(request, tokens)

    async def tokenize(self, request: GenerationRequest) -> tuple[list[int], list[Boundary]]:
        """``prompt_tokens`` (and their checkpoint boundaries) on this
        model's tokenizing thread, checked against the context length.
        Raises ``ModelUnloaded`` once dropped."""
        tokens, marks = await self.with_tokenizer(lambda _: self._tokens_and_boundaries(request))
        self.check_context(len(tokens), request)
        return tokens, marks

    async def with_tokenizer(self, fn: Callable[[Any], T]) -> T:
        """``fn(tokenizer)`` on this model's tokenizing thread (see
        ``__init__``). Raises ``ModelUnloaded`` once dropped."""
        try:
            future = self._tokenize_thread.submit(lambda: fn(self.get()[1]))
        except RuntimeError:  # shut down by drop()
            raise ModelUnloaded(self.name) from None
        return await asyncio.wrap_future(future)

    def opens_reasoning(self, request: GenerationRequest, tokens: list[int]) -> bool:
        """Whether this chat prompt ends inside a reasoning block its template
        opened. Never for a continued message (a prefill): the answer has
        begun, whatever think block the template wrote before its text."""
        fmt = self.reasoning_format
        return (request.messages is not None and request.prompt_end != "continue" and fmt is not None
                and fmt.opens_in(tokens))

    def check_context(self, n_prompt: int, request: GenerationRequest) -> None:
        check_context(n_prompt, request, self.max_context)

    def prepare(self, request: GenerationRequest, control: GenerationControl) -> Prepared:
        """Validate and tokenize (unless ``control.prompt_ids`` already holds
        the tokens): everything that can fail before the model runs."""
        _, tokenizer = self.get()
        if request.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        if control.prompt_ids is not None:
            tokens = control.prompt_ids
            marks = control.prompt_boundaries or []
        else:
            tokens = prompt_tokens(tokenizer, request)
            marks = self.prompt_boundaries(request, tokens)
        n_prompt = len(tokens)
        self.check_context(n_prompt, request)
        limit = self.max_context
        control.prompt_tokens = n_prompt
        control.opens_reasoning = self.opens_reasoning(request, tokens)
        s = request.sampling
        penalties = s.repetition_penalty != 1.0 or bool(s.presence_penalty) or bool(s.frequency_penalty)
        processors, phase = self._processors(request, tokenizer, control.opens_reasoning)
        return Prepared(
            tokens=tokens,
            # The KV cache was budgeted for max_context tokens: never decode past it.
            max_tokens=min(request.max_tokens, max(1, limit - n_prompt)),
            sampler=sampling.make_sampler(request.sampling, self.vocab_size),
            processors=processors,
            stops=StopMatcher(request.stop),
            # Penalties look back over tokens stream_generate itself processed:
            # give it as many as on a cold start, so the output is the same.
            keep=PENALTY_CONTEXT if penalties else 1,
            logprobs=request.logprobs,
            reasoning=phase,
            boundaries=marks,
        )

    def _processors(
        self, request: GenerationRequest, tokenizer: Any, opens_reasoning: bool
    ) -> tuple[list[Any], ReasoningPhase | None]:
        processors: list[Any] = []
        if request.logit_bias:
            # First, as mlx-lm orders its own: the penalties see biased logits.
            processors.append(sampling.bias_tokens(request.logit_bias, self.vocab_size))
        processors += sampling.make_logits_processors(request.sampling)
        if request.ignore_eos:
            # After the bias, so that no bias can revive the end token.
            eos = set(getattr(tokenizer, "eos_token_ids", None) or ())
            processors.append(sampling.suppress_tokens(eos, self.vocab_size))
        grammar: list[Any] = []
        if request.constraint is not None:
            grammars = self.grammars
            matcher = grammars.matcher(request.constraint)
            grammar.append(GrammarProcessor(matcher, grammars.mask_size, grammars.eos_token_ids,
                                            report=functools.partial(grammars.report_failure, request.constraint)))
        phase = reasoning_phase(self.reasoning_format, opens=opens_reasoning, budget=request.reasoning_budget,
                                after=grammar)
        processors += last_processors(phase, grammar)
        return processors, phase


# mlx-lm's default group size for a quantised KV cache (stream_generate's too).
KV_GROUP_SIZE = 64


def feed(model: Any, tokens: Any, cache: list[Any], kv_bits: int | None) -> None:
    """Worker thread: prefill ``tokens`` (an ``mx.array``) into ``cache``,
    quantised from the first token with ``kv_bits``, and evaluate it."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    with mx.stream(generation_stream):
        model(tokens[None], cache=cache)
        quantize_kv(cache, kv_bits)
        mx.eval([c.state for c in cache])


def quantize_kv(cache: list[Any], kv_bits: int | None) -> None:
    """Worker thread: ``cache``'s full-attention layers made quantised
    (``kv_bits``), in place; the others kept as they are. mlx-lm quantises
    every layer that has ``to_quantized``, and a sliding-window layer's
    (Gemma 3/4, gpt-oss) raises "RotatingKVCache Quantization NYI", which
    failed every request of such a model; its window bounds it anyway, so
    the full layers are where the memory is. Linear-attention state
    (ArraysCache) has no KV to quantise."""
    if kv_bits is None:
        return
    for i, layer in enumerate(cache):
        if type(layer).__name__ == "KVCache":
            cache[i] = layer.to_quantized(group_size=KV_GROUP_SIZE, bits=kv_bits)


def _vocab_size(model: Any, tokenizer: Any) -> int:
    """The width of the model's logits. Wrapper architectures (Qwen3.5,
    Mistral 3, Gemma 3) keep it in ``text_config``; the tokenizer's own
    ``vocab_size`` leaves out its added tokens, so it is the last resort."""
    args = getattr(model, "args", None)
    for source in (args, getattr(args, "text_config", None)):
        size = source.get("vocab_size") if isinstance(source, dict) else getattr(source, "vocab_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return int(getattr(tokenizer, "vocab_size", 0) or 0)
