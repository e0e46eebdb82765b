"""pydantic-ai with OpenAIProvider(base_url=...): the chat model and the
Responses model, a plain answer and a typed output_type each; the Embedder
over OpenAIEmbeddingModel."""

from __future__ import annotations

import json

import pytest
from clients.clients_support import DOCUMENTS, QUERY, assert_minilm_vectors, drive, post

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_pydantic_ai_models_run_against_the_demo(demo):
    got = drive("pydantic-ai", "pydantic_ai_models.py", demo.url)
    for kind in ("chat", "responses"):
        assert got[f"{kind}_plain"].strip()
        typed = got[f"{kind}_typed"]
        assert typed["level"] in ("low", "high") and isinstance(typed["ok"], bool), got



def test_pydantic_ai_embedder_gives_mlxds_minilm_vectors(demo):
    got = drive("pydantic-ai", "pydantic_ai_embedder.py", demo.url, timeout=300, DOCUMENTS=json.dumps(DOCUMENTS),
                QUERY=QUERY)
    assert_minilm_vectors(demo, got["documents"], got["query"])
    usage = post(demo.url, "/v1/embeddings", {"model": "minilm", "input": DOCUMENTS}).json()["usage"]
    assert got["model"] == "minilm" and got["input_tokens"] == usage["prompt_tokens"]
    # MiniLM is no Matryoshka model: pydantic-ai raises mlxd's 400, which names the setting.
    assert got["refused"]["status"] == 400 and got["refused"]["body"]["param"] == "dimensions"
