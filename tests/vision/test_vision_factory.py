"""The vision factory makes a real Qwen2-VL-shaped model that mlx-vlm loads."""

from __future__ import annotations

import json

import pytest
from vision.vision_support import TINY_VISION

from mlxd.factory import VisionRecipe, build_vision_model
from mlxd.registry.resolve import detect_kind

pytestmark = pytest.mark.mlx


def test_the_folder_has_what_mlx_vlm_needs(vision_tiny):
    config = json.loads((vision_tiny / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    assert detect_kind(config) == "vision"
    # transformers rejects a float mlp_ratio (2.0) in the vision config.
    assert isinstance(config["vision_config"]["mlp_ratio"], int)
    tokens = json.loads((vision_tiny / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in tokens}
    assert config["image_token_id"] == ids["<|image_pad|>"]
    assert config["vision_start_token_id"] == ids["<|vision_start|>"]
    processor = json.loads((vision_tiny / "preprocessor_config.json").read_text())
    assert processor["max_pixels"] <= 112 * 112
    template = json.loads((vision_tiny / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|image_pad|>" in template


def test_a_build_is_deterministic_and_cached(vision_tiny, tmp_path):
    again = build_vision_model(TINY_VISION, cache_dir=tmp_path)
    assert again.name == vision_tiny.name
    for name in ("model.safetensors", "tokenizer.json", "config.json", "preprocessor_config.json"):
        assert (again / name).read_bytes() == (vision_tiny / name).read_bytes(), name
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    assert build_vision_model(TINY_VISION, cache_dir=tmp_path) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime


def test_unknown_recipes_are_rejected():
    with pytest.raises(ValueError, match="unknown size"):
        VisionRecipe(size="huge")
    with pytest.raises(ValueError, match="unknown dtype"):
        VisionRecipe(dtype="int3")
