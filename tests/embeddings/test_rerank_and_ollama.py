"""/v1/rerank (and /rerank, /v2/rerank) against sentence-transformers'
CrossEncoder, and Ollama's /api/embed and /api/embeddings as plain
curl-like requests over the same path as /v1/embeddings."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from embeddings.conftest import REFERENCE
from embeddings.reference.texts import RERANK_DOCUMENTS, RERANK_QUERY
from mlxd.files import file_sha256

pytestmark = pytest.mark.mlx


def post(daemon, path: str, body: dict) -> httpx.Response:
    # As json.dumps writes it (a lone surrogate escaped), which httpx's json= cannot send.
    return httpx.post(daemon.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                      timeout=60)


def test_a_query_and_ten_documents_come_back_in_the_reference_order(encoders_daemon, tiny_reranker) -> None:
    reference = json.loads((REFERENCE / "rerank_scores.json").read_text())
    assert file_sha256(tiny_reranker / "model.safetensors").hexdigest() == reference["rerank_model_sha256"], (
        "the factory's cross-encoder changed: rerun tests/embeddings/reference/make_reference.py")
    answer = post(encoders_daemon, "/v1/rerank", {"model": "rerank", "query": RERANK_QUERY,
                                                 "documents": RERANK_DOCUMENTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == reference["order"]
    for r in results:
        assert r["relevance_score"] == pytest.approx(reference["scores"][r["index"]], abs=1e-5)
        assert r["document"]["text"] == RERANK_DOCUMENTS[r["index"]]
    assert answer.json()["usage"]["total_tokens"] > len(RERANK_DOCUMENTS) * 5


@pytest.mark.parametrize("route", ["/rerank", "/v2/rerank"])
def test_the_other_rerank_routes_top_n_and_document_objects(encoders_daemon, route) -> None:
    reference = json.loads((REFERENCE / "rerank_scores.json").read_text())
    answer = post(encoders_daemon, route, {
        "model": "rerank", "query": RERANK_QUERY, "top_n": 3, "return_documents": False,
        "documents": [{"text": d} for d in RERANK_DOCUMENTS]})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == reference["order"][:3]
    assert all("document" not in r for r in results)


@pytest.mark.parametrize("body, param", [
    ({"model": "rerank", "query": "q", "documents": []}, "documents"),
    ({"model": "rerank", "query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"model": "embed", "query": "q", "documents": ["a"]}, "model"),
    ({"model": "rerank", "documents": ["a"]}, "query"),
    # Lone surrogates: valid JSON, no tokenizer's text (they were 500s).
    ({"model": "rerank", "query": "a\ud800", "documents": ["a"]}, "query"),
    ({"model": "rerank", "query": "q", "documents": ["a", {"text": "\udfff"}]}, "documents"),
])
def test_bad_rerank_requests_are_400s(encoders_daemon, body, param) -> None:
    answer = post(encoders_daemon, "/v1/rerank", body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_ollama_embed_is_the_same_vector_as_v1_embeddings(encoders_daemon) -> None:
    texts = ["why is the sky blue?", "because of Rayleigh scattering"]
    ours = post(encoders_daemon, "/api/embed", {"model": "minilm", "input": texts})
    assert ours.status_code == 200, ours.text
    body = ours.json()
    assert body["model"] == "minilm" and len(body["embeddings"]) == 2
    assert body["prompt_eval_count"] > 0 and body["total_duration"] > 0
    openai_shape = post(encoders_daemon, "/v1/embeddings", {"model": "minilm", "input": texts}).json()
    assert body["embeddings"] == [d["embedding"] for d in openai_shape["data"]]
    one = post(encoders_daemon, "/api/embed", {"model": "minilm", "input": texts[0]}).json()
    # Alone, the text is not padded to its neighbour's length: the pass has
    # other shapes, and float32 rounds its last bits otherwise.
    assert len(one["embeddings"]) == 1
    np.testing.assert_allclose(one["embeddings"][0], body["embeddings"][0], rtol=0, atol=1e-6)
    legacy = post(encoders_daemon, "/api/embeddings", {"model": "minilm", "prompt": texts[0]}).json()
    assert legacy["embedding"] == one["embeddings"][0]
    assert np.linalg.norm(legacy["embedding"]) == pytest.approx(1.0, abs=1e-5)


def test_ollama_routes_read_json_under_curls_form_content_type(encoders_daemon) -> None:
    # `curl -d '{...}'`, as Ollama's docs and ours write it, says the body is
    # form-encoded: Ollama reads it as JSON anyway, and so must we.
    curl = {"content-type": "application/x-www-form-urlencoded"}
    for path, field, answer_key in (("/api/embed", "input", "embeddings"), ("/api/embeddings", "prompt", "embedding")):
        answer = httpx.post(encoders_daemon.url + path, headers=curl, timeout=60,
                            content=json.dumps({"model": "minilm", field: "why is the sky blue?"}))
        assert answer.status_code == 200, answer.text
        assert answer.json()[answer_key]
    garbled = httpx.post(encoders_daemon.url + "/api/embed", headers=curl, content="model=minilm&input=x", timeout=60)
    assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]


def test_ollama_truncate_false_and_errors_in_ollamas_shape(encoders_daemon) -> None:
    long_text = "many words in a row " * 100
    refused = post(encoders_daemon, "/api/embed", {"model": "embed", "input": long_text, "truncate": False})
    assert refused.status_code == 400
    assert "input[0]" in refused.json()["error"] and isinstance(refused.json()["error"], str)
    unknown = post(encoders_daemon, "/api/embed", {"model": "nope", "input": "x"})
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], str)
    malformed = post(encoders_daemon, "/api/embed", {"model": "embed"})
    assert malformed.status_code == 400 and "input" in malformed.json()["error"]
    for path, field in (("/api/embed", "input"), ("/api/embeddings", "prompt")):
        surrogate = post(encoders_daemon, path, {"model": "embed", field: "a\ud800"})
        assert surrogate.status_code == 400 and "unpaired UTF-16 surrogate" in surrogate.json()["error"], path
