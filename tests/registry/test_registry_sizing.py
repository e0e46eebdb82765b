"""Memory strings, exact weights from safetensors headers, KV cache size."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.sizing import (
    format_bytes,
    kv_cache_bytes,
    parse_bytes,
    parse_gb,
    parse_memory_budget,
    weights_bytes,
)

GIB, MIB, KIB = 1024**3, 1024**2, 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (1234, 1234),
        (2.0e9, 2_000_000_000),
        ("1234", 1234),
        ("256MB", 256 * MIB),
        ("256mb", 256 * MIB),
        ("512 KiB", 512 * KIB),
        ("1.5GiB", 3 * GIB // 2),
        ("48GB", 48 * GIB),
        ("2g", 2 * GIB),
        ("1TB", 1024 * GIB),
        ("100B", 100),
        (".5GB", GIB // 2),
    ],
)
def test_sizes_are_read_in_binary_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("12XB", "cannot read"),
        ("GB", "cannot read"),
        ("-1GB", "cannot read"),
        (-5, "negative"),
        (1.5, "whole"),
        (True, "expected a size"),
        ([1], "expected a size"),
        ("70%", "only allowed for manager.memory_budget"),
    ],
)
def test_bad_sizes_are_rejected_with_a_reason(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_bytes(value)


def test_memory_budget_accepts_a_share_of_physical_memory():
    assert parse_memory_budget("70%", physical_memory=10 * GIB) == 7 * GIB
    assert parse_memory_budget("100 %", physical_memory=10 * GIB) == 10 * GIB
    assert parse_memory_budget("12.5%", physical_memory=8 * GIB) == GIB
    assert parse_memory_budget("2GB", physical_memory=1) == 2 * GIB
    assert parse_memory_budget(3 * GIB, physical_memory=1) == 3 * GIB


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("0%", "above 0%"),
        ("150%", "at most 100%"),
        (100, "read as 100 bytes"),
        ("0GB", "larger than 0"),
    ],
)
def test_memory_budget_rejects_nonsense(value, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_memory_budget(value, physical_memory=16 * GIB)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (100, 100 * GIB),
        (1.5, 3 * GIB // 2),
        ("64", 64 * GIB),
        ("64GB", 64 * GIB),
        ("512mb", 512 * MIB),
        ("2048b", 2048),
    ],
)
def test_vllm_mlx_memory_budget_gb(value, expected):
    assert parse_gb(value) == expected


@pytest.mark.parametrize("value", [0, -1, "lots", True, float("inf")])
def test_vllm_mlx_memory_budget_gb_rejects_nonsense(value):
    with pytest.raises(ValueError):
        parse_gb(value)


def test_format_bytes_picks_a_readable_unit():
    assert format_bytes(3.1 * GIB) == "3.1 GB"
    assert format_bytes(256 * MIB) == "256.0 MB"
    assert format_bytes(1536) == "1.5 KB"
    assert format_bytes(12) == "12 B"


@pytest.mark.mlx
@pytest.mark.parametrize("quant_bits", [None, 4])
def test_weights_bytes_equal_the_loaded_arrays(quant_bits):
    import mlx.core as mx

    from mlxd.factory import ModelRecipe, build_model

    folder = build_model(ModelRecipe(arch="qwen2", size="tiny", quant_bits=quant_bits))
    loaded = 0
    for file in folder.glob("*.safetensors"):
        loaded += sum(arr.nbytes for arr in mx.load(str(file)).values())
    assert loaded > 0
    assert weights_bytes(folder) == loaded


def test_weights_sum_every_shard_and_skip_a_consolidated_copy(tmp_path, make_model, write_weights):
    folder = make_model(tmp_path / "m", weight_bytes=1000)
    write_weights(
        folder / "model-00002-of-00002.safetensors",
        {"a": ("F32", [10], 40), "b": ("BF16", [3, 5], 30)},
    )
    # Mistral-style repos ship the same weights again in one file.
    write_weights(folder / "consolidated.safetensors", {"all": ("F16", [535], 1070)})
    assert weights_bytes(folder) == 1000 + 40 + 30


def test_weights_without_model_prefix_count_every_file(tmp_path, write_weights):
    folder = tmp_path / "vlm"
    folder.mkdir()
    write_weights(folder / "language.safetensors", {"a": ("F16", [8], 16)})
    write_weights(folder / "vision.safetensors", {"b": ("F16", [4], 8)})
    assert weights_bytes(folder) == 24


def test_weights_are_read_from_the_header_not_the_file_size(tmp_path, make_model):
    folder = make_model(tmp_path / "m", weight_bytes=2048)
    size = (folder / "model.safetensors").stat().st_size
    assert size > 2048
    assert weights_bytes(folder) == 2048


@pytest.mark.parametrize(
    "content",
    [
        b"abc",
        struct.pack("<Q", 10**12) + b"{}",
        struct.pack("<Q", 4) + b"nope",
        struct.pack("<Q", 2) + b"[]",
    ],
)
def test_corrupt_safetensors_is_a_config_error(tmp_path, content):
    (tmp_path / "model.safetensors").write_bytes(content)
    with pytest.raises(ConfigError, match="safetensors"):
        weights_bytes(tmp_path)


def test_truncated_safetensors_is_a_config_error(tmp_path, write_weights):
    write_weights(tmp_path / "model.safetensors", {"w": ("F32", [100], 400)})
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-10])
    with pytest.raises(ConfigError, match="truncated"):
        weights_bytes(tmp_path)


def test_folder_without_weights_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        weights_bytes(tmp_path)


# Llama-3-8B's attention shape.
LLAMA3_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_kv_cache_matches_a_hand_computation():
    # 2 (K,V) x 32 layers x 8 kv heads x 128 head_dim x 8192 tokens x 2 seqs x 2 bytes
    assert kv_cache_bytes(LLAMA3_8B, 8192, 2) == 2 * 32 * 8 * 128 * 8192 * 2 * 2
    assert kv_cache_bytes(LLAMA3_8B, 8192, 2) == 2_147_483_648  # exactly 2 GiB


def test_quantized_kv_cache_counts_packed_bits_and_group_scales():
    # Per head vector of 128 elements at 4 bits: 64 bytes packed, plus a bf16
    # scale and bias for each of the 2 groups of 64: 8 bytes. 72 bytes.
    vectors = 2 * 32 * 8 * 8192 * 2
    assert kv_cache_bytes(LLAMA3_8B, 8192, 2, kv_bits=4) == vectors * 72
    # 8 bits: 128 + 8 bytes per vector.
    assert kv_cache_bytes(LLAMA3_8B, 8192, 2, kv_bits=8) == vectors * 136


def test_kv_cache_dtype_and_head_dim_come_from_the_config():
    float32 = {**LLAMA3_8B, "torch_dtype": "float32"}
    assert kv_cache_bytes(float32, 100, 1) == 2 * 32 * 8 * 128 * 100 * 4
    unstated = {k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}
    assert kv_cache_bytes(unstated, 100, 1) == 2 * 32 * 8 * 128 * 100 * 2
    # Gemma-style explicit head_dim differs from hidden_size / heads.
    explicit = {**LLAMA3_8B, "head_dim": 256}
    assert kv_cache_bytes(explicit, 100, 1) == 2 * 32 * 8 * 256 * 100 * 2
    # Without num_key_value_heads every head has its own K and V.
    mha = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert kv_cache_bytes(mha, 100, 1) == 2 * 32 * 32 * 128 * 100 * 2


def test_kv_cache_of_a_vision_model_uses_text_config():
    config = {
        "model_type": "llava",
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16},
        "text_config": {**LLAMA3_8B, "num_hidden_layers": 4},
    }
    assert kv_cache_bytes(config, 1000, 1) == 2 * 4 * 8 * 128 * 1000 * 2


def test_kv_cache_needs_the_attention_shape():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        kv_cache_bytes({"hidden_size": 64}, 10, 1)
    with pytest.raises(ConfigError, match="head_dim"):
        kv_cache_bytes({"num_hidden_layers": 2, "num_attention_heads": 2}, 10, 1)


def test_kv_cache_of_the_tiny_factory_model(tiny_model: Path):
    config = json.loads((tiny_model / "config.json").read_text())
    # qwen2 tiny: 2 layers, 2 kv heads, head_dim 128 / 4 = 32, float32.
    assert kv_cache_bytes(config, 4096, 1) == 2 * 2 * 2 * 32 * 4096 * 4


def test_conftest_model_shape_is_what_the_tests_assume(llama_like):
    assert kv_cache_bytes(llama_like, 1, 1) == 2 * 2 * 2 * 64 * 2
