"""Counting a conversation's prompt tokens with the model's real chat
template (tools included) without leasing the model: the tokenizer is read
from the model's folder and kept, so a count neither loads the model,
waits in its queue, nor refreshes its idle clock (a client counting tokens
is not using the model)."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from typing import Any

from mlxd.engine.prompt import chat_tokens
from mlxd.registry.model import ModelSpec

# Tokenizers kept (a few MB each); an agent talks to one or two models.
KEEP = 4


class TokenCounter:
    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._tokenizers: OrderedDict[str, Any] = OrderedDict()

    def _tokenizer(self, spec: ModelSpec) -> Any:
        key = str(spec.path)
        with self._lock:
            if key in self._tokenizers:
                self._tokenizers.move_to_end(key)
                return self._tokenizers[key]
        from mlx_lm.utils import load_tokenizer

        tokenizer = load_tokenizer(spec.path)
        with self._lock:
            self._tokenizers[key] = tokenizer
            while len(self._tokenizers) > self._keep:
                self._tokenizers.popitem(last=False)
        return tokenizer

    def _count(self, spec: ModelSpec, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        tokenizer = self._tokenizer(spec)
        if spec.kind == "vision":
            # Vision templates place {"type": "image"} parts themselves; an
            # image counts as its placeholder, not as its patches.
            return len(tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True))
        return len(chat_tokens(tokenizer, messages, tools))

    async def count(self, spec: ModelSpec, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
        # Not MLX work: tokenizing runs on a thread of its own, off the event loop.
        return await asyncio.to_thread(self._count, spec, messages, tools)
