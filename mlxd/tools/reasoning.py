"""How a model marks its reasoning, and which parser splits it out.

Detection is mlx-lm's own: ``TokenizerWrapper.has_thinking`` with its
``think_start`` / ``think_end`` markers (``<think>``...``</think>`` and the
other pairs mlx-lm knows), found in the vocabulary when the tokenizer loads.
mlx-lm does not know gpt-oss's harmony channels (``<|channel|>analysis
<|message|>...``): those are recognised from the same vocabulary and parsed
by ``mlxd.tools.harmony``, from the model's own tokens, with no
``openai-harmony`` (which downloads its vocabulary on first use).

The registry's ``reasoning_parser:`` overrides the guess; ``none`` leaves
reasoning in the answer's text. Pure: no MLX.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.tools.formats import HARMONY, HARMONY_ANALYSIS, HARMONY_TOKENS, NONE, encoded, vocab_of

# Marker pairs by the name ``reasoning_parser:`` gives them, in the order
# mlx-lm's detection tries them. ``qwen3`` and ``deepseek_r1`` are vLLM's
# names for the ``<think>`` pair, accepted so a vLLM registry reads the same.
PAIRS: dict[str, tuple[str, str]] = {
    "think": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
    "deepseek_r1": ("<think>", "</think>"),
    "longcat": ("<longcat_think>", "</longcat_think>"),
    "think_colon": ("<|think:start|>", "<|think:end|>"),
    "gemma4": ("<|channel>thought", "<channel|>"),
    "xtml": ("<|open|>think<|sep|>", "<|close|>think<|sep|>"),
}


@dataclass(frozen=True)
class ReasoningFormat:
    """How one model family writes its reasoning."""

    name: str
    # The markers around a reasoning block (empty for harmony: its channels
    # are headers, parsed by mlxd.tools.harmony).
    start: str = ""
    end: str = ""
    # The end marker as this model's token ids: what a reasoning budget
    # forces when it runs out (empty: no budget can be enforced).
    end_ids: tuple[int, ...] = ()
    start_ids: tuple[int, ...] = ()
    # What a spent budget forces, when more than the end marker (harmony's).
    force_ids: tuple[int, ...] = ()

    @property
    def harmony(self) -> bool:
        return self.name == HARMONY

    def opens_in(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` (token ids) ends inside a reasoning block the
        template opened (Qwen3-Thinking, DeepSeek-R1 end the generation
        prompt with ``<think>``): the answer then starts as reasoning. As
        mlx_lm.server decides it: the last start after the last end."""
        if self.harmony or not self.start_ids:
            return False
        return _rfind(prompt, self.start_ids) > _rfind(prompt, self.end_ids)


# apply_chat_template's own arguments: a template variable by one of these
# names would change what mlxd renders, not what the template sees.
_RESERVED_TEMPLATE_KEYS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
})


def reserved_template_keys() -> frozenset[str]:
    """Names ``chat_template_kwargs`` may not use."""
    return _RESERVED_TEMPLATE_KEYS


def known_parsers() -> list[str]:
    """Every value ``reasoning_parser:`` accepts."""
    return sorted([*PAIRS, HARMONY, "gpt_oss", NONE])


def resolve(tokenizer: Any, override: str | None = None) -> ReasoningFormat | None:
    """The format of a loaded model (mlx-lm ``TokenizerWrapper``); None when
    it has none (its answers are all text)."""
    if override:
        return named(override, tokenizer)
    vocab = vocab_of(tokenizer)
    if all(t in vocab for t in HARMONY_TOKENS):
        return harmony_format(tokenizer)
    if getattr(tokenizer, "has_thinking", False):
        start, end = tokenizer.think_start, tokenizer.think_end
        name = next((n for n, pair in PAIRS.items() if pair == (start, end)), "think")
        return ReasoningFormat(
            name, start, end, tuple(tokenizer.think_end_tokens or ()), tuple(tokenizer.think_start_tokens or ())
        )
    return None


def resolve_plain(tokenizer: Any, override: str | None = None) -> ReasoningFormat | None:
    """The same for a tokenizer mlx-lm did not wrap (a vision model's
    processor): the markers read from its vocabulary as mlx-lm reads them."""
    name = override or guess_from_vocab(vocab_of(tokenizer))
    return named(name, tokenizer) if name else None


def named(name: str, tokenizer: Any = None) -> ReasoningFormat | None:
    """The format ``reasoning_parser: name`` gives (its marker ids from ``tokenizer``)."""
    if name == NONE:
        return None
    if name in (HARMONY, "gpt_oss"):
        return harmony_format(tokenizer)
    if name not in PAIRS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose from {', '.join(known_parsers())}")
    start, end = PAIRS[name]
    return ReasoningFormat(name, start, end, encoded(tokenizer, end), encoded(tokenizer, start))


def guess_from_vocab(vocab: dict[str, Any]) -> str | None:
    """The parser name a vocabulary gets (single-token pairs and harmony, as
    mlx-lm's detection reads them), without loading a tokenizer."""
    if all(t in vocab for t in HARMONY_TOKENS):
        return HARMONY
    for name in ("think", "longcat", "think_colon"):
        start, end = PAIRS[name]
        if start in vocab and end in vocab:
            return name
    if "<|channel>" in vocab and "<channel|>" in vocab:
        return "gemma4"
    if all(t in vocab for t in ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")):
        return "xtml"
    return None


def resolve_from_files(model_dir: Path, override: str | None = None) -> str | None:
    """The parser name a model folder gets, without loading it (``mlxd check``)."""
    if override:
        return None if override == NONE else (HARMONY if override == "gpt_oss" else override)
    try:
        data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    added = data.get("added_tokens") if isinstance(data, dict) else None
    vocab = {t.get("content"): t.get("id") for t in added or () if isinstance(t, dict)}
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and isinstance(model.get("vocab"), dict):
        vocab.update(model["vocab"])
    return guess_from_vocab(vocab)


def harmony_format(tokenizer: Any = None) -> ReasoningFormat:
    """gpt-oss's channels. Their text is split by ``mlxd.tools.harmony``;
    the ids are for a reasoning budget: the analysis message's header opens
    the reasoning, ``<|end|>`` closes it, and a spent budget forces the end
    and the final channel's header, so the answer follows in that channel."""
    return ReasoningFormat(
        HARMONY,
        start_ids=encoded(tokenizer, HARMONY_ANALYSIS),
        end_ids=encoded(tokenizer, "<|end|>"),
        force_ids=encoded(tokenizer, "<|end|><|start|>assistant<|channel|>final<|message|>"),
    )


def _rfind(tokens: list[int], sequence: tuple[int, ...]) -> int:
    n = len(sequence)
    first = sequence[0]
    for i in range(len(tokens) - n, -1, -1):
        if tokens[i] == first and tuple(tokens[i:i + n]) == sequence:
            return i
    return -1
