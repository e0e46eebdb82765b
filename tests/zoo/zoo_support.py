"""Shared pieces of the zoo tests (imported as ``zoo.zoo_support``): the
families, their built folders, and what plain mlx-lm makes of them.

The cache and thinking lanes' tests reuse ``zoo_model`` / ``TEXT_FAMILIES``
(and the conftest's per-family fixtures) to run their paths on every family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxd.factory.zoo import FAMILIES, Family
from mlxd.factory.zoo_build import build_family

TEXT_FAMILIES = tuple(n for n, f in FAMILIES.items() if not f.vision)
VISION_FAMILIES = tuple(n for n, f in FAMILIES.items() if f.vision)

# Real text, not repeated words: a repetitive prompt can make a random model stop at once.
CHAT = [{"role": "user", "content": "Read the configuration file and report the options"}]


def family(name: str) -> Family:
    return FAMILIES[name]


def zoo_model(name: str) -> Path:
    """The family's model folder (built once per content hash, in the factory cache)."""
    return build_family(name)


def mlx_lm_greedy(path: Path, messages: list[dict[str, Any]], max_tokens: int, **template_kwargs: Any) -> str:
    """What plain mlx-lm answers greedily: its own load, template and generate."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)
