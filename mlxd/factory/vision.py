"""Deterministic, content-cached builds of small real vision models.

A Qwen2-VL-shaped model (``model_type: qwen2_vl``): the language half has the
text factory's tiny layer shapes and its trained tokenizer (whose vocabulary
already holds the vision special tokens), the vision tower is a few hundred
thousand seeded parameters. The folder holds what a downloaded mlx-vlm model
holds, so ``mlx_vlm.load(path)`` takes the same path for it as for a user's
model: ``config.json``, ``model.safetensors``, the tokenizer files and a
``preprocessor_config.json`` for the image processor.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from mlxd.factory.cache_root import payload_key
from mlxd.factory.build import SIZES, WEIGHT_SCALE, Shape, default_cache_dir
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.factory.tokenizer import IM_END, train_tokenizer, write_tokenizer
from mlxd.files import build_once

# Bump when the output of a build changes for the same recipe.
VISION_FACTORY_VERSION = 1

# CLIP's normalisation, as Qwen2-VL ships it.
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class VisionShape:
    text: Shape
    depth: int
    embed_dim: int
    num_heads: int
    # transformers' config class rejects a float here (2.0): keep it an int.
    mlp_ratio: int
    patch_size: int
    merge_size: int
    # Images are resized to at most this many pixels: it bounds the image's
    # share of the prompt to max_pixels / (patch_size * merge_size)**2 tokens.
    min_pixels: int
    max_pixels: int


VISION_SIZES: dict[str, VisionShape] = {
    # 1.6 M parameters; an image costs at most 16 prompt tokens.
    "tiny": VisionShape(SIZES["tiny"], 2, 64, 4, 2, 14, 2, 28 * 28, 112 * 112),
}


@dataclass(frozen=True)
class VisionRecipe:
    size: str = "tiny"
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.size not in VISION_SIZES:
            raise ValueError(f"unknown size {self.size!r}; choose from {sorted(VISION_SIZES)}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")

    @property
    def shape(self) -> VisionShape:
        return VISION_SIZES[self.size]

    def slug(self) -> str:
        return f"qwen2_vl-{self.size}-{self.dtype}-s{self.seed}"


def build_vision_model(recipe: VisionRecipe, cache_dir: Path | None = None) -> Path:
    """Return the folder of the vision model ``recipe`` describes, building it once."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    files = stdlib_files(recipe.shape.text.corpus_bytes)
    payload = {
        "recipe": dataclasses.asdict(recipe),
        "shape": dataclasses.asdict(recipe.shape),
        "corpus": corpus_digest(files),
        "python": list(sys.version_info[:2]),
        "factory": VISION_FACTORY_VERSION,
    }
    key = payload_key(payload)
    target = cache_dir / f"{recipe.slug()}-{key}"
    return build_once(target, lambda out: _write_vision_model(recipe, files, out))


def vision_config(recipe: VisionRecipe, vocab_size: int, token_ids: dict[str, int]) -> dict:
    """The ``config.json`` of a Qwen2-VL-shaped model: text keys at the top level
    (as Qwen2-VL checkpoints have them), the tower in ``vision_config``."""
    shape = recipe.shape
    text = shape.text
    head_dim = text.hidden_size // text.num_attention_heads
    # M-RoPE splits each head's rotary half into (time, height, width)
    # sections; Qwen2-VL's [16, 24, 24] for 64, scaled to this head size.
    half = head_dim // 2
    temporal = half // 4
    spatial = (half - temporal) // 2
    mrope_section = [temporal + (half - temporal) % 2, spatial, spatial]
    return {
        "model_type": "qwen2_vl",
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "hidden_size": text.hidden_size,
        "num_hidden_layers": text.num_hidden_layers,
        "intermediate_size": text.intermediate_size,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": text.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": mrope_section},
        "tie_word_embeddings": True,
        "eos_token_id": token_ids[IM_END],
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "torch_dtype": recipe.dtype,
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": shape.depth,
            "embed_dim": shape.embed_dim,
            "hidden_size": text.hidden_size,
            "num_heads": shape.num_heads,
            "mlp_ratio": shape.mlp_ratio,
            "patch_size": shape.patch_size,
            "spatial_patch_size": shape.patch_size,
            "spatial_merge_size": shape.merge_size,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
    }


def preprocessor_config(shape: VisionShape) -> dict:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "min_pixels": shape.min_pixels,
        "max_pixels": shape.max_pixels,
        "patch_size": shape.patch_size,
        "temporal_patch_size": 2,
        "merge_size": shape.merge_size,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }


def _write_vision_model(recipe: VisionRecipe, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_vlm.models import qwen2_vl
    from mlx_vlm.utils import update_module_configs

    shape = recipe.shape
    tok = train_tokenizer(files, shape.text.vocab_size)
    write_tokenizer(tok, out, shape.text.max_position_embeddings)
    token_ids = {t: tok.token_to_id(t) for t in (IM_END, "<|image_pad|>", "<|video_pad|>",
                                                 "<|vision_start|>", "<|vision_end|>")}
    config = vision_config(recipe, tok.get_vocab_size(), token_ids)

    # As mlx_vlm.utils.load_model builds it: the top-level keys become the
    # text config, then each module's config becomes its own class.
    fields = json.loads(json.dumps(config))
    model_config = update_module_configs(
        qwen2_vl.ModelConfig.from_dict(fields), qwen2_vl, fields, ["text", "vision"]
    )
    mx.random.seed(recipe.seed)
    model = qwen2_vl.Model(model_config)
    dtype = getattr(mx, recipe.dtype)
    # Scaled up as in the text factory, so greedy output is varied text and
    # the image's features visibly move it.
    model.update(
        tree_map(
            lambda p: (p * WEIGHT_SCALE if p.ndim == 2 else p).astype(dtype),
            model.parameters(),
        )
    )
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(shape), indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))
