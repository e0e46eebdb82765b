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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mlxd.engine import sampling
from mlxd.engine.lifecycle import GenerationControl
from mlxd.engine.prompt import prompt_tokens
from mlxd.engine.stops import StopMatcher
from mlxd.engine.types import GenerationRequest
from mlxd.errors import BadRequest, ModelUnloaded
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.grammar.processor import GrammarProcessor
from mlxd.tools import formats as tool_formats

# Prompt tokens always left for stream_generate after our own chunked prefill:
# mlx-lm's repetition and presence penalties look back 20 tokens, and they only
# see the tokens stream_generate itself processed.
PENALTY_CONTEXT = 32


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
    # Alternatives per token when the request wants logprobs (None: it does not).
    logprobs: int | None = None


class TextModel:
    """The model and tokenizer of one engine, until ``drop``. Worker thread."""

    def __init__(
        self, name: str, model: Any, tokenizer: Any, max_context: int, tool_parser: str | None = None
    ) -> None:
        self.name = name
        self._model = model
        self._tokenizer = tokenizer
        self.max_context = max_context
        self.vocab_size = _vocab_size(model, tokenizer)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size)
        # How this model writes tool calls (None: it has no format mlxd knows).
        self.tool_format = tool_formats.resolve(tokenizer, tool_parser)
        # Tokenizing runs on a thread of this model's own (one caller at a
        # time, so a tokenizer never sees two at once) that ends with the
        # model: the Rust tokenizers library keeps per-thread state for every
        # tokenizer that encoded on a thread, freed only when that thread
        # exits. Tokenized on asyncio's long-lived pool threads, each load
        # left ~50 KB behind after its unload (measured, tokenizers 0.23).
        self._tokenize_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tokenize-{name}")

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

    async def tokenize(self, request: GenerationRequest) -> list[int]:
        """``prompt_tokens`` on this model's tokenizing thread, checked
        against the context length. Raises ``ModelUnloaded`` once dropped."""
        try:
            future = self._tokenize_thread.submit(self.prompt_tokens, request)
        except RuntimeError:  # shut down by drop()
            raise ModelUnloaded(self.name) from None
        tokens = await asyncio.wrap_future(future)
        self.check_context(len(tokens), request)
        return tokens

    def check_context(self, n_prompt: int, request: GenerationRequest) -> None:
        param = "messages" if request.messages is not None else "prompt"
        if n_prompt == 0:
            raise BadRequest("The prompt is empty.", param=param)
        limit = self.max_context
        if n_prompt > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens, but the "
                f"prompt has {n_prompt} tokens. Shorten the {param}.",
                param=param,
                code="context_length_exceeded",
            )

    def prepare(self, request: GenerationRequest, control: GenerationControl) -> Prepared:
        """Validate and tokenize (unless ``control.prompt_ids`` already holds
        the tokens): everything that can fail before the model runs."""
        _, tokenizer = self.get()
        if request.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        tokens = control.prompt_ids if control.prompt_ids is not None else prompt_tokens(tokenizer, request)
        n_prompt = len(tokens)
        self.check_context(n_prompt, request)
        limit = self.max_context
        control.prompt_tokens = n_prompt
        s = request.sampling
        penalties = s.repetition_penalty != 1.0 or bool(s.presence_penalty) or bool(s.frequency_penalty)
        return Prepared(
            tokens=tokens,
            # The KV cache was budgeted for max_context tokens: never decode past it.
            max_tokens=min(request.max_tokens, max(1, limit - n_prompt)),
            sampler=sampling.make_sampler(request.sampling, self.vocab_size),
            processors=self._processors(request, tokenizer),
            stops=StopMatcher(request.stop),
            # Penalties look back over tokens stream_generate itself processed:
            # give it as many as on a cold start, so the output is the same.
            keep=PENALTY_CONTEXT if penalties else 1,
            logprobs=request.logprobs,
        )

    def _processors(self, request: GenerationRequest, tokenizer: Any) -> list[Any]:
        processors: list[Any] = []
        if request.logit_bias:
            # First, as mlx-lm orders its own: the penalties see biased logits.
            processors.append(sampling.bias_tokens(request.logit_bias, self.vocab_size))
        processors += sampling.make_logits_processors(request.sampling)
        if request.ignore_eos:
            # After the bias, so that no bias can revive the end token.
            eos = set(getattr(tokenizer, "eos_token_ids", None) or ())
            processors.append(sampling.suppress_tokens(eos, self.vocab_size))
        if request.constraint is not None:
            # Last, so that no later processor can revive a masked token.
            grammars = self.grammars
            matcher = grammars.matcher(request.constraint)
            processors.append(GrammarProcessor(matcher, self.vocab_size, grammars.eos_token_ids,
                                               report=functools.partial(grammars.report_failure, request.constraint)))
        return processors


def _vocab_size(model: Any, tokenizer: Any) -> int:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    return int(getattr(tokenizer, "vocab_size", 0) or 0)
