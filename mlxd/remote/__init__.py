"""Registry entries served by other servers (another mlxd, vLLM, any OpenAI-compatible one)."""
