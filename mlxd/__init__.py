"""mlxd: one daemon, several MLX models, one OpenAI-compatible API."""

__version__ = "0.1.0"
