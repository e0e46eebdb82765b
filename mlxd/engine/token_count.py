"""Counting a conversation's prompt tokens with the model's real chat
template (tools included) without leasing the model: the tokenizer (for a
vision model, its processor and config) is read from the model's folder and
kept, so a count neither loads the weights, waits in the model's queue, nor
refreshes its idle clock (a client counting tokens is not using the model).

A vision model's images are counted as the model sees them: the processor
expands each into its vision tokens (``engine/vision_inputs.py``, the same
code the vision engine prefills with), so the count of a message with an
image is the ``input_tokens`` of that message answered. Which count a
model takes is its kind's ``token_counter`` (``mlxd.registry.kinds``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from mlxd.engine.kinds import named_function
from mlxd.engine.prompt import chat_tokens
from mlxd.engine.types import PromptEnd
from mlxd.errors import BadRequest, ModelLoadFailed
from mlxd.registry.kinds import ModelKind
from mlxd.registry.model import ModelSpec
from mlxd.tools import formats as tool_formats
from mlxd.tools.formats import ToolFormat

log = logging.getLogger(__name__)

# Tokenizers kept (a few MB each); an agent talks to one or two models.
KEEP = 4


class TemplateCount:
    """A text model's count: its chat template (tools included) and
    tokenizer, which also tells its tool-call format."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, images: list[Any],
        template_kwargs: dict[str, Any] | None = None, end: PromptEnd = "new_turn",
    ) -> int:
        return len(chat_tokens(self.tokenizer, messages, tools, template_kwargs, end=end))


def text_counter(spec: ModelSpec) -> TemplateCount:
    from mlx_lm.utils import load_tokenizer

    return TemplateCount(load_tokenizer(spec.path))


def vision_counter(spec: ModelSpec) -> Callable[..., int]:
    """A vision model's count: its processor expands each image into the
    vision tokens the model sees."""
    from mlxd.engine.vision_inputs import load_vision_processor, prepare_vision_inputs

    vision = load_vision_processor(spec.path, trust_remote_code=spec.trust_remote_code)

    def count(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, images: list[Any],
        template_kwargs: dict[str, Any] | None = None, end: PromptEnd = "new_turn",
    ) -> int:
        return prepare_vision_inputs(vision.processor, vision.config, messages=messages, images=images,
                                     template_kwargs=template_kwargs, end=end).n_tokens

    return count


class TokenCounter:
    """Each model's counter (its kind's ``token_counter``), made once per
    model folder and kept for the last few models counted with."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _counter(self, spec: ModelSpec, kind: ModelKind) -> Any:
        key = (str(spec.path), kind.name)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        if kind.token_counter is None:
            raise BadRequest(f"`{spec.name}` ({kind.name}) counts no prompt tokens.", param="model")
        try:
            loaded = named_function(kind.token_counter)(spec)
        except Exception as exc:
            log.exception("reading the tokenizer of %s from %s failed", spec.name, spec.path)
            raise ModelLoadFailed(
                f"The tokenizer of `{spec.name}` could not be read ({type(exc).__name__}); "
                "see the daemon log for details."
            ) from exc
        with self._lock:
            self._kept[key] = loaded
            while len(self._kept) > self._keep:
                self._kept.popitem(last=False)
        return loaded

    async def tool_format(self, spec: ModelSpec, kind: ModelKind) -> ToolFormat | None:
        """The tool-call format the model ``spec`` has once loaded, read from
        its tokenizer (a kind without grammars, vision, takes no tools)."""
        if not kind.grammars:
            return None

        def resolve() -> ToolFormat | None:
            counter = self._counter(spec, kind)
            return tool_formats.resolve(counter.tokenizer, spec.tool_parser) if isinstance(counter, TemplateCount) else None

        return await asyncio.to_thread(resolve)

    async def count(
        self,
        spec: ModelSpec,
        kind: ModelKind,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        images: list[Any] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        end: PromptEnd = "new_turn",
    ) -> int:
        """``images``: a vision request's decoded images, in message order;
        ``template_kwargs``: the template variables the answer would render
        with (a thinking model's no-think prompt is shorter); ``end``: where
        its prompt ends (a prefill's inside the last message)."""
        # Not the model's work: it runs on a thread of its own, off the event
        # loop and off the worker every model decodes on.
        return await asyncio.to_thread(
            lambda: self._counter(spec, kind)(messages, tools, images or [], template_kwargs, end)
        )
