"""langchain-openai (ChatOpenAI) and langchain-anthropic (ChatAnthropic):
plain answers, streamed; bind_tools with parsed args; with_structured_output.
OpenAIEmbeddings: mlxd's own MiniLM vectors."""

from __future__ import annotations

import json

import pytest
from clients.clients_support import DOCUMENTS, QUERY, assert_minilm_vectors, drive

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



def test_langchain_embeddings_are_mlxds_minilm_vectors(demo):
    got = drive("langchain", "langchain_embeddings.py", demo.url, timeout=300,
                DOCUMENTS=json.dumps(DOCUMENTS), QUERY=QUERY)
    assert_minilm_vectors(demo, got["documents"], got["query"])
    assert got["async_documents"] == got["documents"]
