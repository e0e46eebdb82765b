"""GGUF tensor names to mlx-lm's, per architecture."""

from __future__ import annotations

import re

import mlx.core as mx

from mlxd.errors import GGUFError

# llama.cpp's names for a decoder block's parts, and mlx-lm's for the same.
_BLOCK_PARTS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# Tensors llama.cpp stores that mlx-lm computes itself: llama 3's RoPE
# frequency factors come from config.json's rope_scaling.
_DERIVED = {"rope_freqs"}

# Architectures whose GGUF tensors map onto an mlx-lm model of the same
# ``model_type`` with the names above.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2")

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias|scales|biases)$")
_TOP_RE = re.compile(r"^([a-z_]+)\.(weight|bias|scales|biases)$")


def check_architecture(architecture: str) -> None:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"GGUF architecture `{architecture}` is not supported "
            f"(mlxd converts {', '.join(SUPPORTED_ARCHITECTURES)})"
        )


def mlx_lm_name(gguf_name: str) -> str | None:
    """mlx-lm's name for ``gguf_name``; None for a tensor mlx-lm derives itself.
    Raises :class:`GGUFError` for a tensor the architecture does not have."""
    if match := _BLOCK_RE.match(gguf_name):
        layer, part, leaf = match.groups()
        if part in _BLOCK_PARTS:
            return f"model.layers.{layer}.{_BLOCK_PARTS[part]}.{leaf}"
    elif match := _TOP_RE.match(gguf_name):
        part, leaf = match.groups()
        if part in _TOP_LEVEL:
            return f"{_TOP_LEVEL[part]}.{leaf}"
        if part in _DERIVED:
            return None
    raise GGUFError(f"GGUF tensor `{gguf_name}` has no counterpart in mlx-lm's model")


def rename(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    renamed = {}
    for name, value in tensors.items():
        target = mlx_lm_name(name)
        if target is not None:
            renamed[target] = value
    return renamed
