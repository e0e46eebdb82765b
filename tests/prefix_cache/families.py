"""Tiny random-weight models of the 2026 families, one per kind of cache,
built from mlx-lm's own model classes for the prefix-cache tests.

A stopgap until the zoo's family table (mlxd/factory/, lane zoo) is merged;
then these tests take their models from it. Each model gets the factory's
trained tokenizer (so greedy text is varied) and its chat template; what
differs between the families here is the architecture and so the cache.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mlxd.factory.build import SIZES, WEIGHT_SCALE, build_once, default_cache_dir
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.factory.tokenizer import IM_END, train_tokenizer, write_tokenizer

# The sliding window is small so that a few hundred tokens of conversation
# go past it: the case where a rotating cache can no longer be trimmed.
WINDOW = 48

_BASE = {"hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
         "tie_word_embeddings": True, "rope_theta": 10000.0}

CONFIGS: dict[str, dict[str, Any]] = {
    # KVCache.
    "qwen3": {"model_type": "qwen3"},
    # RotatingKVCache on the local layers, KVCache on the global ones.
    "gemma3_text": {"model_type": "gemma3_text", "sliding_window": WINDOW, "sliding_window_pattern": 2,
                    "query_pre_attn_scalar": 16, "rope_local_base_freq": 10000.0},
    # ArraysCache (gated delta net) on three layers in four, KVCache on the fourth.
    "qwen3_next": {"model_type": "qwen3_next", "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
                   "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                   "shared_expert_intermediate_size": 64, "mlp_only_layers": [], "moe_intermediate_size": 32,
                   "partial_rotary_factor": 0.5, "full_attention_interval": 4},
    # RotatingKVCache and KVCache alternating, attention sinks, experts.
    "gpt_oss": {"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"] * 2},
    # Multi-head latent attention: a KVCache holding the compressed latent.
    "deepseek_v3": {"model_type": "deepseek_v3", "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "qk_nope_head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                    "n_group": 1, "topk_group": 1},
    # CacheList(ArraysCache, KVCache) per layer: mamba2 and attention side by side.
    "falcon_h1": {"model_type": "falcon_h1", "mamba_d_conv": 4, "mamba_d_head": 16, "mamba_d_ssm": 64,
                  "mamba_d_state": 16, "mamba_expand": 1, "mamba_n_groups": 1, "mamba_n_heads": 4,
                  "mamba_chunk_size": 16, "mlp_expansion_factor": 2},
}

FAMILIES = tuple(CONFIGS)


def build_family(family: str, cache_dir: Path | None = None) -> Path:
    """The folder of ``family``'s tiny model, built once (content-keyed)."""
    files = stdlib_files(SIZES["tiny"].corpus_bytes)
    config = {**_BASE, **CONFIGS[family]}
    key = hashlib.sha256(json.dumps([config, corpus_digest(files), WEIGHT_SCALE], sort_keys=True).encode())
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    return build_once(root / f"family-{family}-{key.hexdigest()[:12]}", lambda out: _write(config, files, out))


def _write(config: dict[str, Any], files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes

    tok = train_tokenizer(files, SIZES["tiny"].vocab_size)
    write_tokenizer(tok, out, config["max_position_embeddings"])
    config = {**config, "vocab_size": tok.get_vocab_size(), "eos_token_id": tok.token_to_id(IM_END)}
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(lambda p: p * WEIGHT_SCALE if p.ndim == 2 else p, model.parameters()))
    weights = dict(tree_flatten(model.parameters()))
    # Some classes rename weights on load (sanitize); save what they load.
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
