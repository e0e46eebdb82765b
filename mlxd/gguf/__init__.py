"""GGUF files (llama.cpp, Ollama, LM Studio) to mlx-lm model folders."""

from mlxd.gguf.convert import import_gguf

__all__ = ["import_gguf"]
