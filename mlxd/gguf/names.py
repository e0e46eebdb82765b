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
# llama.cpp stores Llama 3.1's RoPE frequency factors as a tensor; mlx-lm
# computes them from rope_scaling parameters the GGUF file does not keep, so
# dropping the tensor would silently change the model.
_UNSUPPORTED = {"rope_freqs": "Llama 3.1-style RoPE frequency factors (rope_freqs)"}

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


def mlx_lm_name(gguf_name: str) -> str:
    """mlx-lm's name for ``gguf_name``. Raises :class:`GGUFError` for a
    tensor the architecture does not have."""
    if match := _BLOCK_RE.match(gguf_name):
        layer, part, leaf = match.groups()
        if part in _BLOCK_PARTS:
            return f"model.layers.{layer}.{_BLOCK_PARTS[part]}.{leaf}"
    elif match := _TOP_RE.match(gguf_name):
        part, leaf = match.groups()
        if part in _TOP_LEVEL:
            return f"{_TOP_LEVEL[part]}.{leaf}"
        if part in _UNSUPPORTED:
            raise GGUFError(f"GGUF tensor `{gguf_name}`: {_UNSUPPORTED[part]} are not supported")
    raise GGUFError(f"GGUF tensor `{gguf_name}` has no counterpart in mlx-lm's model")


def rename(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    return {mlx_lm_name(name): value for name, value in tensors.items()}
