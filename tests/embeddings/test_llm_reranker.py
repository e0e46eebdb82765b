"""LLM rerankers (Qwen3-Reranker style) through /v1/rerank: a causal LM
served by mlx-lm, scored P(yes) against P(no) after the model card's prompt.
The factory's model has random weights, so no order is right: the answer's
shape, its determinism, and each score equal to the same computation done
directly with mlx-lm (one prompt at a time, no batching, no padding)."""

from __future__ import annotations

import httpx
import pytest

from embeddings.conftest import CODE_INSTRUCTION
from embeddings.reference.texts import RERANK_DOCUMENTS, RERANK_QUERY
from mlxd.engine.rerank_llm import PREFIX, SUFFIX, pair_text

pytestmark = pytest.mark.mlx


def rerank(daemon, body: dict) -> httpx.Response:
    return httpx.post(daemon.url + "/v1/rerank", json={"model": "rerank-llm", **body}, timeout=120)


def direct_scores(folder, query: str, documents: list[str], instruction: str | None = None) -> list[float]:
    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(folder))
    yes, no = (tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no"))
    scores = []
    for document in documents:
        ids = [*tokenizer.encode(PREFIX, add_special_tokens=False),
               *tokenizer.encode(pair_text(query, document, instruction), add_special_tokens=False),
               *tokenizer.encode(SUFFIX, add_special_tokens=False)]
        last = model(mx.array([ids]))[0, -1].astype(mx.float32)
        scores.append(mx.softmax(mx.stack([last[no], last[yes]]))[1].item())
    return scores


def test_scores_are_mlx_lm_s_own_yes_no_probability_sorted_and_deterministic(encoders_daemon,
                                                                             llm_reranker) -> None:
    documents = list(RERANK_DOCUMENTS)
    first = rerank(encoders_daemon, {"query": RERANK_QUERY, "documents": documents})
    assert first.status_code == 200, first.text
    results = first.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s < 1.0 for s in scores)
    assert len(set(scores)) > 1, "every document got the same score"
    assert first.json()["usage"]["total_tokens"] > len(documents) * 80  # the prompt is part of each pair

    again = rerank(encoders_daemon, {"query": RERANK_QUERY, "documents": documents, "top_n": 3,
                                     "return_documents": False})
    assert again.status_code == 200, again.text
    assert again.json()["results"] == [{k: r[k] for k in ("index", "relevance_score")} for r in results[:3]]

    expected = direct_scores(llm_reranker, RERANK_QUERY, documents)
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=2e-5), r



def test_an_entry_s_instruction_is_the_one_the_model_reads(encoders_daemon, llm_reranker) -> None:
    """``instruction:`` goes into every pair's prompt: the scores move away
    from the card's instruction's and are mlx-lm's own under the entry's."""
    documents = list(RERANK_DOCUMENTS)
    card = rerank(encoders_daemon, {"query": RERANK_QUERY, "documents": documents})
    code = httpx.post(encoders_daemon.url + "/v1/rerank", timeout=120, json={
        "model": "rerank-llm-code", "query": RERANK_QUERY, "documents": documents})
    assert card.status_code == 200 and code.status_code == 200, code.text
    by_index = {r["index"]: r["relevance_score"] for r in code.json()["results"]}
    card_by_index = {r["index"]: r["relevance_score"] for r in card.json()["results"]}
    assert any(abs(by_index[i] - card_by_index[i]) > 1e-4 for i in by_index), "the instruction changed nothing"

    expected = direct_scores(llm_reranker, RERANK_QUERY, documents, CODE_INSTRUCTION)
    for i, score in by_index.items():
        assert score == pytest.approx(expected[i], abs=2e-5), (i, score, expected[i])
