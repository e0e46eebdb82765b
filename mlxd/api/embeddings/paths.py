"""Where the embedding and rerank routes are: one list, which the routes,
the gate's route groups (``api.auth``) and the accounts (``api.refusals``)
all read, so a route added here is scoped, limited and counted with the
others. Kept apart from ``routes.py`` so that those modules can import it
without the request path."""

from __future__ import annotations

OLLAMA_PREFIX = "/api"
EMBEDDINGS = "/v1/embeddings"
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")
OLLAMA_EMBED = OLLAMA_PREFIX + "/embed"
# Ollama's older route: one ``prompt``, one vector.
OLLAMA_EMBEDDINGS = OLLAMA_PREFIX + "/embeddings"
PATHS = (EMBEDDINGS, *RERANK_PATHS, OLLAMA_EMBED, OLLAMA_EMBEDDINGS)
