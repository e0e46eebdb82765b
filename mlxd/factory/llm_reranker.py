"""A tiny random LLM reranker shaped like Qwen3-Reranker: the zoo's qwen3
row (mlx-lm's own class, Qwen's special tokens and chat template) with
``architectures: [Qwen3ForCausalLM]`` as the real checkpoint says, and
"yes" and "no" as single tokens of its vocabulary, the two answers its
score compares. Random weights: its scores are deterministic, not meaningful.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mlxd.factory.zoo import FAMILIES, Family


def reranker_row() -> Family:
    qwen3 = FAMILIES["qwen3"]
    return dataclasses.replace(
        qwen3,
        name="qwen3_reranker",
        markup=(*qwen3.markup, "yes", "no"),
        config={**qwen3.config, "architectures": ["Qwen3ForCausalLM"]},
        note="Qwen3-Reranker shape (a causal LM scoring yes / no)",
    )


def build_llm_reranker(cache_dir: Path | None = None) -> Path:
    """The model folder, built on first use (as a zoo row is)."""
    from mlxd.factory.zoo_build import build_row

    return build_row(reranker_row(), cache_dir)
