"""/v1/embeddings end to end: the official openai client (base64 by
default, float, dimensions), LangChain's OpenAIEmbeddings, and
all-MiniLM-L6-v2's vectors against sentence-transformers' own."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest

from embeddings.conftest import REFERENCE
from embeddings.reference.texts import TEXTS

pytestmark = pytest.mark.mlx


def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def test_minilm_matches_sentence_transformers_on_100_texts(encoders_daemon) -> None:
    reference = np.load(REFERENCE / "minilm_vectors.npy")
    got = client(encoders_daemon).embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert vectors.shape == reference.shape == (100, 384)
    cosine = (vectors * reference).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.9999, (cosine.argmin(), cosine.min())
    # Three of the texts are past MiniLM's 256 tokens: cut as sentence-transformers cuts them.
    assert got.usage.prompt_tokens > 256 * 3


def test_minilm_puts_like_sentences_together(encoders_daemon) -> None:
    got = client(encoders_daemon).embeddings.create(
        model="all-minilm", input=["a cat sits on the mat", "a kitten rests on a rug", "stock markets fell sharply"])
    cat, kitten, stocks = (np.array(d.embedding) for d in got.data)
    assert cat @ kitten > 0.6 > 0.1 > cat @ stocks


def test_the_clients_default_base64_is_the_float_vector_byte_for_byte(encoders_daemon) -> None:
    texts = ["first text", "a second, longer text than the first one"]
    with httpx.Client(base_url=encoders_daemon.url) as http:
        floats = http.post("/v1/embeddings", json={"model": "minilm", "input": texts}).json()
        packed = http.post("/v1/embeddings", json={"model": "minilm", "input": texts,
                                                  "encoding_format": "base64"}).json()
    for f, b in zip(floats["data"], packed["data"]):
        raw = base64.b64decode(b["embedding"])
        assert raw == np.array(f["embedding"], dtype="<f4").tobytes()
    # The openai client asks for base64 unless told otherwise, and decodes it.
    default = client(encoders_daemon).embeddings.create(model="minilm", input=texts)
    assert [d.embedding for d in default.data] == [np.array(f["embedding"], dtype="<f4").tolist()
                                                  for f in floats["data"]]
    assert default.usage.prompt_tokens == floats["usage"]["prompt_tokens"] > 0


def test_dimensions_truncate_and_renormalise_on_a_matryoshka_model(encoders_daemon) -> None:
    api = client(encoders_daemon)
    full = np.array(api.embeddings.create(model="embed", input="some words here").data[0].embedding)
    short = np.array(api.embeddings.create(model="embed", input="some words here", dimensions=16).data[0].embedding)
    assert short.shape == (16,)
    assert np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(short, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)


def test_dimensions_on_a_model_not_trained_for_it_is_a_clear_400(encoders_daemon) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(encoders_daemon).embeddings.create(model="minilm", input="x", dimensions=128)
    assert "matryoshka" in caught.value.message and "384" in caught.value.message
    assert caught.value.body["param"] == "dimensions"
    # Its own size is no change, and fine.
    same = client(encoders_daemon).embeddings.create(model="minilm", input="x", dimensions=384)
    assert len(same.data[0].embedding) == 384
    # Refused before any input is embedded: 500 long inputs read nothing.
    inputs_before = encoders_daemon.model("minilm")["engine"]["inputs"]
    with pytest.raises(openai.BadRequestError):
        client(encoders_daemon).embeddings.create(model="minilm", input=["a long input " * 50] * 500, dimensions=10)
    assert encoders_daemon.model("minilm")["engine"]["inputs"] == inputs_before


def test_langchain_openai_embeddings(encoders_daemon) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain would otherwise send
    # OpenAI's tiktoken ids (meaningless to another model, and tiktoken's
    # files come from the network).
    lc = OpenAIEmbeddings(model="minilm", base_url=encoders_daemon.url + "/v1", api_key="unused",
                          check_embedding_ctx_length=False)
    docs = lc.embed_documents(["a cat sits on the mat", "stock markets fell sharply"])
    query = lc.embed_query("a kitten rests on a rug")
    assert len(docs) == 2 and len(query) == 384
    assert np.dot(query, docs[0]) > np.dot(query, docs[1]) + 0.3


def truncated_inputs(daemon, model: str) -> float:
    for line in httpx.get(daemon.url + "/metrics").text.splitlines():
        if line.startswith(f'mlxd_embedding_truncated_inputs_total{{model="{model}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_langchain_with_the_models_own_tokenizer_embeds_a_long_text_whole(encoders_daemon, minilm) -> None:
    from langchain_openai import OpenAIEmbeddings

    # docs/embeddings.md: tiktoken_enabled=False with MiniLM's own folder and
    # its 256 tokens less [CLS] and [SEP]; LangChain sends pieces of text.
    lc = OpenAIEmbeddings(model="minilm", base_url=encoders_daemon.url + "/v1", api_key="unused",
                          tiktoken_enabled=False, tiktoken_model_name=str(minilm), embedding_ctx_length=254)
    long_text = "The quick brown fox jumps over the lazy dog near the river bank. " * 60
    cut_before = truncated_inputs(encoders_daemon, "minilm")
    short, whole = lc.embed_documents(["a cat sits on the mat", long_text])
    assert truncated_inputs(encoders_daemon, "minilm") == cut_before  # no piece was cut
    ours = client(encoders_daemon).embeddings.create(model="minilm", input=["a cat sits on the mat", long_text])
    assert truncated_inputs(encoders_daemon, "minilm") == cut_before + 1  # sent whole, mlxd cuts it
    np.testing.assert_allclose(short, ours.data[0].embedding, rtol=0, atol=1e-5)
    # The whole text, averaged over its pieces: not mlxd's vector of its first 256 tokens.
    assert np.linalg.norm(whole) == pytest.approx(1.0, abs=1e-5)
    assert np.dot(whole, ours.data[1].embedding) < 0.9999


def test_token_arrays_are_the_models_own_ids(encoders_daemon, tiny_embedder) -> None:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json")).encode("hello there").ids
    api = client(encoders_daemon)
    by_text = api.embeddings.create(model="embed", input="hello there", encoding_format="float")
    by_ids = api.embeddings.create(model="embed", input=[ids], encoding_format="float")
    np.testing.assert_allclose(by_ids.data[0].embedding, by_text.data[0].embedding, atol=1e-6)
    single = api.embeddings.create(model="embed", input=ids, encoding_format="float")
    assert single.data[0].embedding == by_ids.data[0].embedding
    assert by_ids.usage.prompt_tokens == len(ids)
    # One token array past 2048 ids is one input (cut to the model's length), not 2049 inputs.
    long = api.embeddings.create(model="embed", input=(ids * 1100)[:2049], encoding_format="float")
    assert len(long.data) == 1 and long.usage.prompt_tokens <= 128


def test_truncation_follows_the_entry(encoders_daemon) -> None:
    long_text = "many words in a row " * 100
    api = client(encoders_daemon)
    cut = api.embeddings.create(model="embed", input=["short", long_text])
    assert cut.usage.prompt_tokens <= 128 + 10
    with pytest.raises(openai.BadRequestError) as caught:
        api.embeddings.create(model="strict", input=["short", long_text])
    assert caught.value.body["param"] == "input[1]"
    assert "128 tokens" in caught.value.message and "truncate: false" in caught.value.message
    metrics = httpx.get(encoders_daemon.url + "/metrics").text
    assert 'mlxd_embedding_truncated_inputs_total{model="embed"}' in metrics


@pytest.mark.parametrize("body, param", [
    ({"model": "embed", "input": []}, "input"),
    ({"model": "embed", "input": ["x"] * 2049}, "input"),
    ({"model": "embed", "input": [[1, 2], []]}, "input[1]"),
    ({"model": "embed", "input": [[5, 10 ** 7]]}, "input[0]"),
    ({"model": "embed", "input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "embed", "input": "x", "dimensions": 0}, "dimensions"),
    # Booleans are no numbers (pydantic took `true` for 1).
    ({"model": "embed", "input": "x", "dimensions": True}, "dimensions"),
    ({"model": "embed", "input": [True, 5]}, "input[0]"),
    ({"model": "embed", "input": "x", "dimensions": 65}, "dimensions"),
    ({"model": "chat", "input": "x"}, "model"),
    ({"model": "rerank", "input": "x"}, "model"),
    # A lone surrogate is valid JSON and no tokenizer's text: it was a 500.
    ({"model": "embed", "input": "a\ud800b"}, "input"),
    ({"model": "embed", "input": ["fine", "\udc00"]}, "input"),
])
def test_bad_requests_are_400s_naming_the_field(encoders_daemon, body, param) -> None:
    # As json.dumps writes it (a lone surrogate escaped), which httpx's json= cannot send.
    answer = httpx.post(encoders_daemon.url + "/v1/embeddings", content=json.dumps(body), timeout=60,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_an_unknown_model_is_a_404(encoders_daemon) -> None:
    with pytest.raises(openai.NotFoundError):
        client(encoders_daemon).embeddings.create(model="nope", input="x")


def test_an_embedding_model_on_the_chat_route_is_a_400(encoders_daemon) -> None:
    answer = httpx.post(encoders_daemon.url + "/v1/chat/completions", timeout=60, json={
        "model": "embed", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 400, answer.text
    assert "embedding model" in answer.json()["error"]["message"]


def test_status_lists_the_kinds(encoders_daemon) -> None:
    client(encoders_daemon).embeddings.create(model="minilm", input="loads it")
    models = {m["name"]: m for m in encoders_daemon.status()["models"]}
    listed = {m["id"]: m for m in httpx.get(encoders_daemon.url + "/v1/models").json()["data"]}
    assert listed["minilm"]["kind"] == "embedding" and listed["rerank"]["kind"] == "rerank"
    assert models["minilm"]["state"] == "loaded"
