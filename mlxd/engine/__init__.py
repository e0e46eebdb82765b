"""How a model generates: mlx-lm and mlx-vlm engines on one MLX worker thread."""
