"""pydantic-ai's Embedder over its OpenAIEmbeddingModel with
OpenAIProvider(base_url=...), as its docs reach an OpenAI-compatible
server: documents and a query, their usage, and ``dimensions`` asked of a
model not trained for it (mlxd's 400, as pydantic-ai raises it).
DOCUMENTS (JSON) and QUERY."""

import json
import os

from pydantic_ai import Embedder
from pydantic_ai.embeddings.openai import OpenAIEmbeddingModel
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.providers.openai import OpenAIProvider

provider = OpenAIProvider(base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused")
embedder = Embedder(OpenAIEmbeddingModel("minilm", provider=provider))
documents = embedder.embed_documents_sync(json.loads(os.environ["DOCUMENTS"]))
query = embedder.embed_query_sync(os.environ["QUERY"])
out = {"documents": [list(v) for v in documents.embeddings], "query": list(query.embeddings[0]),
       "input_tokens": documents.usage.input_tokens, "model": documents.model_name}
try:
    embedder.embed_query_sync(os.environ["QUERY"], settings={"dimensions": 128})
except ModelHTTPError as refused:
    out["refused"] = {"status": refused.status_code, "body": refused.body}
print(json.dumps(out))
