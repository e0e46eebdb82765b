"""Counting a conversation's prompt tokens with the model's real chat
template (tools included) without leasing the model: the tokenizer (for a
vision model, its processor and config) is read from the model's folder and
kept, so a count neither loads the weights, waits in the model's queue, nor
refreshes its idle clock (a client counting tokens is not using the model).

A vision model's images are counted as the model sees them: the processor
expands each into its vision tokens (``engine/vision_inputs.py``, the same
code the vision engine prefills with), so the count of a message with an
image is the ``input_tokens`` of that message answered."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from mlxd.engine.prompt import chat_tokens
from mlxd.engine.vision_inputs import load_vision_processor, prepare_vision_inputs
from mlxd.errors import ModelLoadFailed
from mlxd.registry.model import ModelSpec
from mlxd.tools import formats as tool_formats
from mlxd.tools.formats import ToolFormat

log = logging.getLogger(__name__)

# Tokenizers kept (a few MB each); an agent talks to one or two models.
KEEP = 4


class TokenCounter:
    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _cached(self, spec: ModelSpec, load: Callable[[], Any]) -> Any:
        key = (str(spec.path), spec.kind)
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
        try:
            loaded = load()
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

    def _tokenizer(self, spec: ModelSpec) -> Any:
        from mlx_lm.utils import load_tokenizer

        return self._cached(spec, lambda: load_tokenizer(spec.path))

    def _count(
        self, spec: ModelSpec, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, images: list[Any],
        template_kwargs: dict[str, Any] | None,
    ) -> int:
        if spec.kind == "vision":
            vision = self._cached(
                spec, lambda: load_vision_processor(spec.path, trust_remote_code=spec.trust_remote_code)
            )
            return prepare_vision_inputs(vision.processor, vision.config, messages=messages, images=images,
                                         template_kwargs=template_kwargs).n_tokens
        return len(chat_tokens(self._tokenizer(spec), messages, tools, template_kwargs))

    async def tool_format(self, spec: ModelSpec) -> ToolFormat | None:
        """The tool-call format the text model ``spec`` has once loaded, read
        from its tokenizer (a vision model takes no tools)."""
        if spec.kind == "vision":
            return None
        return await asyncio.to_thread(lambda: tool_formats.resolve(self._tokenizer(spec), spec.tool_parser))

    async def count(
        self,
        spec: ModelSpec,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        images: list[Any] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> int:
        """``images``: a vision request's decoded images, in message order;
        ``template_kwargs``: the template variables the answer would render
        with (a thinking model's no-think prompt is shorter)."""
        # Not the model's work: it runs on a thread of its own, off the event
        # loop and off the worker every model decodes on.
        return await asyncio.to_thread(self._count, spec, messages, tools, images or [], template_kwargs)
