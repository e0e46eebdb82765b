"""langchain-openai (ChatOpenAI) and langchain-anthropic (ChatAnthropic):
plain answers, streamed; bind_tools with parsed args; with_structured_output.
OpenAIEmbeddings: mlxd's own MiniLM vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clients.clients_support import drive, minilm_vectors

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_langchain_chat_models_run_against_the_demo(demo):
    got = drive("langchain", "langchain.py", demo.url)
    assert got["openai_plain"].strip() and got["openai_stream"] == got["openai_plain"]
    # The finish chunk carried usage too, and LangChain counted a streamed request's tokens twice.
    assert got["usage_streamed"] == got["usage_invoked"] == [got["usage_invoked"][0], 5]
    assert got["anthropic_plain"].strip()
    for surface in ("openai_tool", "anthropic_tool"):
        assert got[surface]["name"] == "get_weather"
        assert got[surface]["args"]["city"] in ("Paris", "Oslo") and 1 <= got[surface]["args"]["days"] <= 7
    assert got["openai_typed"]["level"] in ("low", "high") and isinstance(got["openai_typed"]["ok"], bool)


DOCUMENTS = ["a cat sits on the mat", "stock markets fell sharply"]
QUERY = "a kitten rests on a rug"


def test_langchain_embeddings_are_mlxds_minilm_vectors(demo):
    got = drive("langchain", "langchain_embeddings.py", demo.url, timeout=300,
                DOCUMENTS=json.dumps(DOCUMENTS), QUERY=QUERY)
    documents, query = np.array(got["documents"]), np.array(got["query"])
    assert documents.shape == (2, 384) and query.shape == (384,)
    assert np.linalg.norm(documents, axis=1) == pytest.approx([1, 1], abs=1e-5)
    # What /v1/embeddings itself answers for the same texts, sync and async.
    np.testing.assert_allclose(documents, minilm_vectors(demo, DOCUMENTS), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["async_documents"], documents, rtol=0, atol=1e-6)
    np.testing.assert_allclose(query, minilm_vectors(demo, [QUERY])[0], rtol=0, atol=1e-6)
    # MiniLM is a trained model: the kitten is nearer the cat than the markets.
    assert query @ documents[0] > query @ documents[1] + 0.3
