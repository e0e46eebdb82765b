"""GGUF files written from the factory's tiny models, the way llama.cpp's
converter lays them out (Q/K rows permuted for llama, GPT-2 BPE vocabulary),
with llama.cpp's own ``gguf`` writer.

``quantized_source`` also writes the MLX model those GGUF blocks mean: the
same 4- or 8-bit values, scales and offsets as an mlx-lm quantized folder. A
correct import of the GGUF file gives that model's greedy output exactly;
comparing against the float model would only measure quantization noise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

Q4_0, Q4_1, Q8_0, F16 = (
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.F16
)
GROUP = 32

_PARTS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(name: str) -> str:
    for mlx_name, gguf in (("model.embed_tokens", "token_embd"), ("model.norm", "output_norm"), ("lm_head", "output")):
        if name.startswith(mlx_name + "."):
            return gguf + name[len(mlx_name):]
    _, _, layer, rest = name.split(".", 3)
    part, leaf = rest.rsplit(".", 1)
    return f"blk.{layer}.{_PARTS[part]}.{leaf}"


def _permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order, for its interleaved RoPE."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _q4_1(w: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """GGUF Q4_1 blocks and the MLX affine 4-bit triple with the same values."""
    wq, scales, biases = mx.quantize(mx.array(w.astype(np.float16)), group_size=GROUP, bits=4)
    packed = np.array(wq).view(np.uint8)
    q = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(w.shape[0], -1, GROUP)
    nibbles = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    d = np.array(scales).astype(np.float16)[..., None].view(np.uint8)
    m = np.array(biases).astype(np.float16)[..., None].view(np.uint8)
    blocks = np.concatenate([d, m, nibbles], axis=-1).reshape(w.shape[0], -1)
    return blocks, {"weight": np.array(wq), "scales": np.array(scales), "biases": np.array(biases)}


def _q4_0(w: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """GGUF Q4_0 blocks (llama.cpp's rounding) and the MLX 4-bit triple with
    the same values: (q - 8) * d is q * d + (-8 d)."""
    groups = w.astype(np.float32).reshape(w.shape[0], -1, GROUP)
    extreme = np.take_along_axis(groups, np.abs(groups).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    d = (extreme / -8).astype(np.float16)
    inverse = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d).astype(np.float32))
    q = np.clip((groups * inverse[..., None] + 8.5).astype(np.int8), 0, 15).astype(np.uint8)
    nibbles = q[..., :16] | (q[..., 16:] << 4)
    blocks = np.concatenate([d[..., None].view(np.uint8), nibbles], axis=-1).reshape(w.shape[0], -1)
    flat = q.reshape(w.shape[0], -1)
    packed = (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8)
    triple = {
        "weight": np.ascontiguousarray(packed).view(np.uint32),
        "scales": d,
        "biases": (d.astype(np.float32) * -8).astype(np.float16),
    }
    return blocks, triple


def _q8_0(w: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """GGUF Q8_0 blocks and the MLX affine 8-bit triple with the same values."""
    groups = w.astype(np.float32).reshape(w.shape[0], -1, GROUP)
    d = (np.abs(groups).max(axis=-1) / 127).astype(np.float16)
    safe = np.where(d == 0, 1, d).astype(np.float32)
    q = np.clip(np.round(groups / safe[..., None]), -127, 127).astype(np.int8)
    blocks = np.concatenate([d[..., None].view(np.uint8), q.view(np.uint8)], axis=-1).reshape(w.shape[0], -1)
    unsigned = (q.astype(np.int16) + 128).astype(np.uint8).reshape(w.shape[0], -1)
    triple = {
        "weight": unsigned.view(np.uint32),
        "scales": d,
        "biases": (d.astype(np.float32) * -128).astype(np.float16),
    }
    return blocks, triple


def write_gguf(model_dir: Path, out: Path, qtype: GGMLQuantizationType, *,
               quantized_source: Path | None = None) -> Path:
    """Write ``model_dir`` (a factory model) as a GGUF file of ``qtype``
    matrices; the embeddings stay float32 so both models compute in float32."""
    config = json.loads((model_dir / "config.json").read_text())
    arch = config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(model_dir / "model.safetensors")).items()}
    source_weights: dict[str, np.ndarray] = {}

    writer = GGUFWriter(str(out), arch)
    writer.add_name(model_dir.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_file_type(int(qtype))
    _add_tokenizer(writer, model_dir, config)

    for name, w in sorted(weights.items()):
        source_weights[name] = w
        matrix = w.ndim == 2 and not name.startswith("model.embed_tokens")
        if qtype == F16 or not matrix:
            data = w.astype(np.float16) if (qtype == F16 and w.ndim == 2) else w
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                data = _permute(data, heads if "q_proj" in name else kv_heads)
            writer.add_tensor(gguf_name(name), data)
            continue
        blocks, triple = {Q4_0: _q4_0, Q4_1: _q4_1, Q8_0: _q8_0}[qtype](w)
        layer = name.removesuffix(".weight")
        del source_weights[name]
        source_weights.update({f"{layer}.{k}": v for k, v in triple.items()})
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            blocks = _permute(blocks, heads if "q_proj" in name else kv_heads)
        writer.add_tensor(gguf_name(name), blocks, raw_dtype=qtype)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    if quantized_source is not None and qtype != F16:
        shutil.copytree(model_dir, quantized_source)
        mx.save_safetensors(
            str(quantized_source / "model.safetensors"),
            {k: mx.array(v) for k, v in source_weights.items()}, metadata={"format": "mlx"},
        )
        config["quantization"] = {"group_size": GROUP, "bits": 8 if qtype == Q8_0 else 4}
        (quantized_source / "config.json").write_text(json.dumps(config))
    return out


def _add_tokenizer(writer: GGUFWriter, model_dir: Path, config: dict) -> None:
    data = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = {**data["model"]["vocab"], **{t["content"]: t["id"] for t in data["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda item: item[1])]
    special = {t["content"] for t in data["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok_config["chat_template"])
