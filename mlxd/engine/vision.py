"""The mlx-vlm vision engine: chat messages and decoded images in, streamed text out.

The same contract as the text engine (``engine/text.py``): a generation is a
synchronous generator stepped on the shared worker thread, one token per
step, so other models keep decoding between this model's tokens. The model
is loaded with ``mlx_vlm.load``, the prompt rendered and tokenized with the
images by ``engine/vision_inputs.py`` (mlx-vlm's ``apply_chat_template`` and
``prepare_inputs``, which also runs the image processor; count_tokens counts
with the same code), and decoded with ``mlx_vlm.stream_generate``.

Everything that touches the model runs on the worker. Importing mlx-vlm
elsewhere is safe: its generation stream is thread-local
(``mx.new_thread_local_stream``), so the worker gets its own.

One generation at a time per vision model: mlx-vlm keeps per-generation
state on the model object (Qwen-VL's M-RoPE position deltas live on the
language model between steps), so two interleaved generations on one model
would corrupt each other. Requests for the same vision model therefore take
turns in arrival order, on the worker; other models are not held up.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.engine import memory, sampling
from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.lifecycle import EngineBase, GenerationControl, load_on_worker, measured_load, relay, warm_after_load
from mlxd.engine.local_output import LocalOutput
from mlxd.engine.reasoning_budget import ReasoningPhase, last_processors, observe, reasoning_phase
from mlxd.engine.stops import StopMatcher
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.engine.vision_inputs import prepare_vision_inputs
from mlxd.engine.warmup import WARM_SAMPLING, WarmupReport
from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.errors import (
    BadRequest,
    ContextTooLong,
    ModelLoadFailed,
    ModelUnloaded,
)
from mlxd.registry.model import ModelSpec
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.grammar.processor import GrammarProcessor
from mlxd.tools import fallback
from mlxd.tools import formats as tool_formats
from mlxd.tools import reasoning as reasoning_formats
from mlxd.tools.output_request import OutputRequest

log = logging.getLogger(__name__)

@dataclass
class LoadedVision:
    """What the worker hands back from a load: the model, its processor and what they cost."""

    model: Any
    processor: Any
    load_bytes: int
    load_seconds: float
    warmup: WarmupReport | None = None


@dataclass
class _Prepared:
    prompt: str
    inputs: dict[str, Any]
    max_tokens: int
    sampler: Any
    processors: list[Any]
    stops: StopMatcher
    # A thinking model's reasoning phase (its token count for usage).
    reasoning: ReasoningPhase | None = None


# --- loading ---------------------------------------------------------------------


async def load_vision_engine(spec: ModelSpec, worker: MlxWorker, *, cache_dir: Path | None = None) -> VisionEngine:
    """Load ``spec`` with ``mlx_vlm.load`` on the worker and wrap it as a VisionEngine
    (``cache_dir`` unused: a vision engine keeps no prefix cache).

    A load cancelled by its caller still finishes on the worker (it cannot be
    interrupted) and is then unloaded, so it never leaves memory behind.
    """
    if importlib.util.find_spec("mlx_vlm") is None:
        raise ModelLoadFailed(
            f"Model `{spec.name}` is a vision model but mlx-vlm is not installed "
            "(pip install 'mlxd[vision]')"
        )
    loaded = await load_on_worker(worker, load_vision_model, spec, _unload)
    return VisionEngine(spec, worker, loaded)


def load_vision_model(spec: ModelSpec) -> LoadedVision:
    """Worker thread: ``mlx_vlm.load`` plus the active memory it added."""

    def load() -> Any:
        import mlx_vlm

        return mlx_vlm.load(str(spec.path), trust_remote_code=spec.trust_remote_code)

    done = measured_load(spec, load, _release_vlm_memory)
    model, processor = done.result
    warmup = _warm_up(spec, model, processor)
    return LoadedVision(model, processor, load_bytes=done.load_bytes, load_seconds=done.load_seconds, warmup=warmup)


# A warm-up's request: a question about one small image, two tokens, drawn
# with every sampling filter on, as the text warm-up draws its own
# (engine/warmup.py): their kernels take any value once compiled.
WARM_MESSAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]
WARM_TOKENS = 2


def _warm_up(spec: ModelSpec, model: Any, processor: Any) -> WarmupReport:
    """Worker thread: one image question right after the load
    (``warm_after_load``), through the same preparation and mlx-vlm's
    ``stream_generate`` as a request. With an empty kernel cache the tiny
    demo vision model's first image request took 7.7 s against 0.03 s on
    this CPU: the vision tower's and the sampler's kernels compiled then."""
    def warm() -> None:
        from PIL import Image

        image = Image.new("RGB", (64, 64), (96, 160, 224))
        prepared = prepare_vision_inputs(processor, model.config, messages=WARM_MESSAGES, images=[image])
        sampler = sampling.make_sampler(WARM_SAMPLING, _vocab_size(model))
        for _ in _stream(model, processor, prepared.prompt, prepared.inputs, WARM_TOKENS, sampler, [], {}):
            pass

    return warm_after_load(spec, warm)


def _stream(model: Any, processor: Any, prompt: Any, inputs: dict[str, Any], max_tokens: int, sampler: Any,
            processors: list[Any], kv_options: dict[str, Any]) -> Iterator[Any]:
    """mlx-vlm's ``stream_generate`` on inputs already prepared (so it does
    not process the images twice)."""
    from mlx_vlm import stream_generate

    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    return stream_generate(
        model,
        processor,
        prompt,
        input_ids=inputs["input_ids"],
        pixel_values=inputs.get("pixel_values"),
        mask=inputs.get("attention_mask"),
        max_tokens=max_tokens,
        sampler=sampler,
        logits_processors=processors or None,
        **extra,
        **kv_options,
    )


def _unload(loaded: LoadedVision) -> None:
    """Worker thread: drop a cancelled load's model there, then free its memory."""
    loaded.model = loaded.processor = None
    _release_vlm_memory()


def _release_vlm_memory() -> dict[str, Any]:
    """Worker thread: finish mlx-vlm's pending work (an aborted generation
    leaves some queued on its stream, holding buffers), then free as the text
    engine does."""
    import mlx.core as mx

    try:
        from mlx_vlm.generate.common import generation_stream
    except ImportError:  # the import itself failed during a load
        pass
    else:
        mx.synchronize(generation_stream)
    return memory.release_memory()


# --- the engine --------------------------------------------------------------------


class VisionEngine(EngineBase, GenerationEngine):
    """A loaded mlx-vlm model: ``mlxd.engine.contract.GenerationEngine``."""

    kind = "vision"
    # Its prompt is checked with the images, by the processor, on the worker.
    accepts_on_worker = True
    # One generation at a time (see above); its images are decoded here.
    batching = False
    wants_image_urls = False

    def __init__(self, spec: ModelSpec, worker: MlxWorker, loaded: LoadedVision) -> None:
        super().__init__(spec, worker, load_bytes=loaded.load_bytes, load_seconds=loaded.load_seconds,
                         warmup=loaded.warmup)
        self._model: Any = loaded.model
        self._processor: Any = loaded.processor
        self.vocab_size = _vocab_size(loaded.model)
        tokenizer = getattr(loaded.processor, "tokenizer", loaded.processor)
        # How it marks its reasoning (qwen3_vl's thinking checkpoints: <think>).
        self.reasoning_format = reasoning_formats.resolve_plain(tokenizer, spec.reasoning_parser)
        # Tools and structured output settled as on the text path
        # (``engine/local_output.py``): the family's call format, and grammars
        # over its vocabulary. A template with no place for tools gets none:
        # the text path writes them into the turns (mlxd.tools.fallback),
        # which image turns do not take yet.
        self.tool_format = _tool_format(tokenizer, spec.tool_parser)
        self.grammars = GrammarCompiler(_GrammarTokenizer(tokenizer), self.vocab_size)
        self.output = LocalOutput(self.tool_format, self.reasoning_format, self.grammars, self.vocab_size)
        # Touched only on the worker thread: generations in arrival order;
        # the first one runs, the others wait their turn.
        self._turns: collections.deque[GenerationControl] = collections.deque()
        self._images = 0

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        return await self.output.settle(requests, output, name)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "waiting": max(0, len(self._turns) - self.counts.running),
            "images": self._images,
        }

    def _forget(self) -> None:
        self._model = None
        self._processor = None

    # ------------------------------------------------------ worker thread
    def _release(self) -> dict[str, Any]:
        self._model = None
        self._processor = None
        return _release_vlm_memory()

    def _run(self, request: GenerationRequest, control: GenerationControl) -> Iterator[Any]:
        self._turns.append(control)
        try:
            while self._turns[0] is not control and control.abort_reason is None:
                yield SKIP
            if control.abort_reason is not None:
                # Aborted before its turn: end without touching the model (it
                # may be about to be released).
                self.counts.abort(control)
                yield GenerationChunk(text="", finish_reason="abort")
                return
            model, processor = self._model, self._processor
            if model is None:
                raise ModelUnloaded(self.name)
            with self.counts.generation(control):
                prepared = self._prepare(model, processor, request, control)
                # Accepted: the prompt and its images fit.
                yield GenerationChunk(text="", prompt_tokens=control.prompt_tokens)
                with self.peak.measure():
                    yield from self._decode(model, processor, prepared, control)
        finally:
            self._turns.remove(control)

    def _prepare(
        self, model: Any, processor: Any, request: GenerationRequest, control: GenerationControl
    ) -> _Prepared:
        """Render, tokenize and process the images: everything that can fail before decoding."""
        if request.max_tokens < 1:
            raise BadRequest("max_tokens must be at least 1.", param="max_tokens")
        images = list(request.images)
        param = "messages" if request.messages is not None else "prompt"
        kwargs = dict(request.chat_template_kwargs or {})
        if request.tools:
            kwargs["tools"] = request.tools
        prepared = prepare_vision_inputs(
            processor, model.config, messages=request.messages, prompt=request.prompt, images=images,
            template_kwargs=kwargs, end=request.prompt_end,
        )
        n_prompt = prepared.n_tokens
        limit = self.spec.max_context
        if n_prompt > limit:
            raise ContextTooLong(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{n_prompt} tokens (images included). Shorten the {param} or send fewer images.",
                param=param, prompt_tokens=n_prompt, limit=limit,
            )
        control.prompt_tokens = n_prompt
        fmt = self.reasoning_format
        if request.messages is not None and request.prompt_end != "continue" and fmt is not None:
            # (A continued message: the answer has begun, as on a text model.)
            control.opens_reasoning = fmt.opens_in(prepared.inputs["input_ids"].reshape(-1).tolist())
        grammar: list[Any] = []
        if request.constraint is not None:
            matcher = self.grammars.matcher(request.constraint)
            grammar.append(GrammarProcessor(matcher, self.grammars.mask_size, self.grammars.eos_token_ids,
                                            report=functools.partial(self.grammars.report_failure, request.constraint)))
        # Last: the budget forces its end marker past every other processor,
        # and the grammar waits for the reasoning to end.
        phase = reasoning_phase(fmt, opens=control.opens_reasoning, budget=request.reasoning_budget, after=grammar)
        self._images += len(images)
        return _Prepared(
            prompt=prepared.prompt,
            inputs=prepared.inputs,
            max_tokens=min(request.max_tokens, max(1, limit - n_prompt)),
            sampler=sampling.make_sampler(request.sampling, self.vocab_size),
            processors=[*self._processors(request, processor), *last_processors(phase, grammar)],
            stops=StopMatcher(request.stop),
            reasoning=phase,
        )

    def _processors(self, request: GenerationRequest, processor: Any) -> list[Any]:
        processors: list[Any] = []
        if request.logit_bias:
            # As on the text path (``TextModel._processors``): bias first, EOS suppression after it.
            processors.append(sampling.bias_tokens(request.logit_bias, self.vocab_size))
        processors += sampling.make_logits_processors(request.sampling)
        if request.ignore_eos:
            tokenizer = getattr(processor, "tokenizer", processor)
            criteria = getattr(tokenizer, "stopping_criteria", None)
            eos = set(getattr(criteria, "eos_token_ids", None) or ())
            processors.append(sampling.suppress_tokens(eos, self.vocab_size))
        return processors

    def _decode(self, model: Any, processor: Any, prepared: _Prepared, control: GenerationControl) -> Iterator[Any]:
        n_prompt = control.prompt_tokens
        stops = prepared.stops

        def chunk(text: str, finish: str | None = None) -> GenerationChunk:
            if finish == "abort":
                self.counts.abort(control)
            return GenerationChunk(
                text=text,
                finish_reason=finish,
                prompt_tokens=n_prompt,
                completion_tokens=control.completion_tokens,
                reasoning_tokens=(
                    prepared.reasoning.reasoning_tokens(control.completion_tokens)
                    if finish and prepared.reasoning is not None else None
                ),
            )

        # The footprint estimate assumes a quantised KV cache from the first token.
        kv_options = {"kv_bits": self.spec.kv_bits, "quantized_kv_start": 0} if self.spec.kv_bits else {}
        responses = _stream(model, processor, prepared.prompt, prepared.inputs, prepared.max_tokens,
                            prepared.sampler, prepared.processors, kv_options)
        yield from relay(responses, control, stops, chunk, pace=self._worker.pace,
                         on_token=lambda response: observe(prepared.reasoning, response.token))


def _tool_format(tokenizer: Any, configured: str | None) -> tool_formats.ToolFormat | None:
    """The call format mlx-lm would infer from the template (mlx-vlm's
    tokenizer is Hugging Face's own, which names none), or ``tool_parser:``."""
    template = getattr(tokenizer, "chat_template", None)
    if not fallback.renders_tools(template):
        return None
    name = tool_formats.guess_name(template, tool_formats.vocab_of(tokenizer), configured)
    return tool_formats.resolve(tokenizer, name) if name else None


class _GrammarTokenizer:
    """A Hugging Face tokenizer in the shape the grammar compiler reads
    from mlx-lm's wrapper: the tokenizer and the ids that end a generation."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        criteria = getattr(tokenizer, "stopping_criteria", None)
        ids = getattr(criteria, "eos_token_ids", None) or getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = [ids] if isinstance(ids, int) else list(ids or ())


def _vocab_size(model: Any) -> int:
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None)
    for source in (text, config):
        size = getattr(source, "vocab_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return 0
