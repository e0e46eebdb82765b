"""Embeddings and reranking: OpenAI's /v1/embeddings, the Cohere/Jina
/v1/rerank and Ollama's /api/embed, adapters over one request path
(``path.py``) into the encoder engines (``mlxd.engine.embedding``)."""
