"""The XLM-R cross-encoder (``XLMRobertaForSequenceClassification``, as
bge-reranker-v2-m3 is) through /v1/rerank, against the same network written
out in numpy from the checkpoint's tensors, one pair at a time: transformers'
XLM-R (positions counted from after the padding index, post-LN layers, exact
GELU) and its classification head (first token, dense, tanh, out_proj),
sentence-transformers' sigmoid on top. mlxd batches the ten pairs with
padding, so the positions and the mask are checked too."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest

from embeddings.reference.texts import RERANK_DOCUMENTS, RERANK_QUERY

pytestmark = pytest.mark.mlx


def layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]


def linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]


def numpy_score(folder, ids: list[int]) -> float:
    import mlx.core as mx

    config = json.loads((folder / "config.json").read_text())
    w = {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in mx.load(str(folder / "model.safetensors")).items()}
    eps, heads, pad = config["layer_norm_eps"], config["num_attention_heads"], config["pad_token_id"]
    ids_ = np.array(ids)
    positions = pad + 1 + np.arange(len(ids))
    x = w["roberta.embeddings.word_embeddings.weight"][ids_] + w["roberta.embeddings.position_embeddings.weight"][
        positions] + w["roberta.embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, w, "roberta.embeddings.LayerNorm", eps)
    erf = np.vectorize(math.erf)
    for i in range(config["num_hidden_layers"]):
        p = f"roberta.encoder.layer.{i}"
        q, k, v = (linear(x, w, f"{p}.attention.self.{n}").reshape(len(ids), heads, -1).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        x = layer_norm(linear(context, w, f"{p}.attention.output.dense") + x, w, f"{p}.attention.output.LayerNorm", eps)
        inner = linear(x, w, f"{p}.intermediate.dense")
        inner = 0.5 * inner * (1 + erf(inner / math.sqrt(2)))
        x = layer_norm(linear(inner, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm", eps)
    logit = linear(np.tanh(linear(x[0], w, "classifier.dense")), w, "classifier.out_proj")[0]
    return 1 / (1 + math.exp(-logit))


def test_xlm_r_cross_encoder_scores_equal_the_network_written_out_in_numpy(encoders_daemon, xlmr_reranker) -> None:
    from tokenizers import Tokenizer

    answer = httpx.post(encoders_daemon.url + "/v1/rerank", timeout=60, json={
        "model": "rerank-xlmr", "query": RERANK_QUERY, "documents": RERANK_DOCUMENTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(len(RERANK_DOCUMENTS)))
    tokenizer = Tokenizer.from_file(str(xlmr_reranker / "tokenizer.json"))
    expected = [numpy_score(xlmr_reranker, tokenizer.encode(RERANK_QUERY, d).ids) for d in RERANK_DOCUMENTS]
    assert len({round(s, 4) for s in expected}) > 1, "every document got the same score"
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5), r
