"""config.json for an mlx-lm model, from GGUF metadata and the renamed tensors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxd.errors import GGUFError

# GGUF blocks hold 32 weights each, for every type MLX keeps quantized.
GGUF_GROUP_SIZE = 32

# llama.cpp's converter permutes Q and K for these architectures so that its
# interleaved ("traditional") RoPE applies; mlx-lm must rotate the same way.
_PERMUTED_QK = {"llama"}


def _required(metadata: Mapping[str, Any], key: str) -> Any:
    if key not in metadata:
        raise GGUFError(f"GGUF metadata lacks `{key}`")
    return metadata[key]


def quantized_layers(tensors: Mapping[str, mx.array]) -> dict[str, tuple[int, int]]:
    """``(group_size, bits)`` of each quantized layer, from the packed shapes.

    Every quantized tensor here has GGUF's block of 32 weights as its group,
    whether MLX kept it from the file or :func:`requantize` made it.
    """
    layers: dict[str, tuple[int, int]] = {}
    for name, scales in tensors.items():
        if not name.endswith(".scales"):
            continue
        layer = name.removesuffix(".scales")
        # in_features = scale columns x group size; packed uint32 columns =
        # in_features x bits / 32.
        in_features = scales.shape[-1] * GGUF_GROUP_SIZE
        bits = tensors[f"{layer}.weight"].shape[-1] * 32 // in_features
        layers[layer] = (GGUF_GROUP_SIZE, bits)
    return layers


def quantization_of(tensors: Mapping[str, mx.array]) -> dict[str, Any] | None:
    """mlx-lm's ``quantization`` section: the most common (group_size, bits)
    as the default, and an entry for each layer that differs from it."""
    layers = quantized_layers(tensors)
    if not layers:
        return None
    (group_size, bits), _ = Counter(layers.values()).most_common(1)[0]
    section: dict[str, Any] = {"group_size": group_size, "bits": bits}
    for layer, (g, b) in sorted(layers.items()):
        if (g, b) != (group_size, bits):
            section[layer] = {"group_size": g, "bits": b}
    return section


def build_config(architecture: str, metadata: Mapping[str, Any], tensors: Mapping[str, mx.array],
                 *, eos_token_ids: list[int], bos_token_id: int | None,
                 dtype: str | None = None) -> dict[str, Any]:
    a = architecture
    heads = int(_required(metadata, f"{a}.attention.head_count"))
    hidden = int(_required(metadata, f"{a}.embedding_length"))
    config: dict[str, Any] = {
        "model_type": a,
        "architectures": ["Qwen2ForCausalLM" if a == "qwen2" else "LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(_required(metadata, f"{a}.block_count")),
        "intermediate_size": int(_required(metadata, f"{a}.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(metadata.get(f"{a}.attention.head_count_kv", heads)),
        "rms_norm_eps": float(metadata.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(metadata.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(metadata.get(f"{a}.context_length", 4096)),
        "vocab_size": int(tensors["model.embed_tokens.weight"].shape[0]),
        "rope_traditional": a in _PERMUTED_QK,
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensors,
        "mlp_bias": False,
        "eos_token_id": eos_token_ids[0] if len(eos_token_ids) == 1 else eos_token_ids,
    }
    key_length = metadata.get(f"{a}.attention.key_length")
    if key_length is not None and int(key_length) != hidden // heads:
        config["head_dim"] = int(key_length)
    if bos_token_id is not None:
        config["bos_token_id"] = bos_token_id
    scaling = metadata.get(f"{a}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {
            "type": "linear", "factor": float(_required(metadata, f"{a}.rope.scaling.factor"))
        }
    elif scaling not in (None, "none"):
        raise GGUFError(f"GGUF RoPE scaling `{scaling}` is not supported")
    if dtype is not None:
        # mlxd's memory estimate reads the activation dtype from here.
        config["torch_dtype"] = dtype
    quantization = quantization_of(tensors)
    if quantization is not None:
        config["quantization"] = quantization
    return config
