"""langchain-openai's OpenAIEmbeddings against mlxd's /v1/embeddings, set up
as langchain-openai's own note for OpenAI-compatible servers says:
``check_embedding_ctx_length=False``, so that it sends the texts (by default
it sends OpenAI's tiktoken ids, whose tables it fetches from the network).
Documents and a query, sync and async."""

import asyncio
import json
import os

from langchain_openai import OpenAIEmbeddings

embeddings = OpenAIEmbeddings(model="minilm", base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused",
                              check_embedding_ctx_length=False)
documents = json.loads(os.environ["DOCUMENTS"])
print(json.dumps({
    "documents": embeddings.embed_documents(documents),
    "query": embeddings.embed_query(os.environ["QUERY"]),
    "async_documents": asyncio.run(embeddings.aembed_documents(documents)),
}))
