"""Builds small but real MLX models offline: a trained tokenizer, a real
mlx-lm architecture with seeded weights, loadable by ``mlx_lm.load`` (or, for
the Qwen2-VL-shaped vision models, by ``mlx_vlm.load``).

The demo registry, the tests and the benchmarks all take their models from here;
``FAMILIES`` (``zoo.py``) is the zoo of the families people run, each built
tiny with its real chat template and special tokens by ``build_family``.
"""

from mlxd.factory.build import ModelRecipe, SIZES, build_model, default_cache_dir
from mlxd.factory.vision import VISION_SIZES, VisionRecipe, build_vision_model
from mlxd.factory.zoo import FAMILIES, Family
from mlxd.factory.zoo_build import build_family

__all__ = [
    "FAMILIES",
    "Family",
    "build_family",
    "ModelRecipe",
    "SIZES",
    "VISION_SIZES",
    "VisionRecipe",
    "build_model",
    "build_vision_model",
    "default_cache_dir",
]
