"""Models served by a gang of MLX distributed ranks (docs/distributed.md)."""
