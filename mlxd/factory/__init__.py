"""Builds small but real MLX models offline: a trained tokenizer, a real
mlx-lm architecture with seeded weights, loadable by ``mlx_lm.load``.

The demo registry, the tests and the benchmarks all take their models from here.
"""

from mlxd.factory.build import ModelRecipe, SIZES, build_model, default_cache_dir

__all__ = ["ModelRecipe", "SIZES", "build_model", "default_cache_dir"]
