"""litellm's other kinds against mlxd: ``embedding`` through the ``openai/``
and ``ollama/`` providers, ``rerank`` through each provider whose wire shape mlxd speaks
(cohere, which posts to ``{api_base}/v2/rerank``, so its base has no
``/v1``; jina_ai; hosted_vllm; infinity, whose documents come back as bare
strings, with ``return_documents=False``), ``speech`` and ``transcription``
through ``openai/``. TEXTS, QUERY and DOCUMENTS are JSON."""

import base64
import io
import json
import os

import litellm

URL = os.environ["MLXD_URL"]
KEY = {"api_key": "unused"}
QUERY, DOCUMENTS = os.environ["QUERY"], json.loads(os.environ["DOCUMENTS"])

embedded = litellm.embedding(model="openai/minilm", input=json.loads(os.environ["TEXTS"]), api_base=URL + "/v1",
                             **KEY)
out = {"embedding": {"vectors": [d["embedding"] for d in embedded.data], "model": embedded.model,
                     "prompt_tokens": embedded.usage.prompt_tokens}, "rerank": {}}
# litellm's ollama/ provider posts to Ollama's /api/embed, at the server's root.
out["ollama_embedding"] = [d["embedding"] for d in litellm.embedding(
    model="ollama/minilm", input=json.loads(os.environ["TEXTS"]), api_base=URL).data]
for provider, base, documents in (("cohere", URL, True), ("jina_ai", URL + "/v1", True),
                                  ("hosted_vllm", URL + "/v1", True), ("infinity", URL, False)):
    ranked = litellm.rerank(model=f"{provider}/rerank-tiny", query=QUERY, documents=DOCUMENTS, top_n=3,
                            return_documents=documents, api_base=base, **KEY)
    out["rerank"][provider] = [{"index": r["index"], "relevance_score": r["relevance_score"],
                                "document": (r.get("document") or {}).get("text")} for r in ranked.results]
wav = litellm.speech(model="openai/tts-1", input=QUERY, voice="alloy", response_format="wav", api_base=URL + "/v1",
                     **KEY).content
out["speech"] = base64.b64encode(wav).decode()
heard = litellm.transcription(model="openai/whisper-1", file=("said.wav", io.BytesIO(wav)), api_base=URL + "/v1",
                              **KEY)
out["transcription"] = heard.text
print(json.dumps(out))
