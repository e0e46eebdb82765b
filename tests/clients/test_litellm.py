"""litellm's `openai/` provider: a plain answer, streamed; a forced tool call
with parsed arguments; a pydantic response_format. Its other kinds: embedding,
rerank through every provider whose shape mlxd speaks, speech, transcription."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
from clients.clients_support import DOCUMENTS, drive, minilm_vectors, post

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_litellm_runs_against_the_demo(demo):
    # Offline: litellm reads its bundled model list instead of fetching it from GitHub.
    got = drive("litellm", "litellm_sdk.py", demo.url, LITELLM_LOCAL_MODEL_COST_MAP="True")
    assert got["plain"].strip() and got["streamed"] == got["plain"]
    assert got["tool"]["name"] == "get_weather"
    assert got["tool"]["args"]["city"] in ("Paris", "Oslo") and 1 <= got["tool"]["args"]["days"] <= 7
    assert got["typed"]["level"] in ("low", "high") and isinstance(got["typed"]["ok"], bool)


QUESTION = "what is mlx"
PASSAGES = ["MLX is an array framework", "bananas", "apples are fruit", "an array library for Apple silicon"]


def test_litellm_embeds_reranks_speaks_and_transcribes_against_the_demo(demo):
    got = drive("litellm", "litellm_encoders.py", demo.url, timeout=300, LITELLM_LOCAL_MODEL_COST_MAP="True",
                TEXTS=json.dumps(DOCUMENTS), QUERY=QUESTION, DOCUMENTS=json.dumps(PASSAGES))
    embedded = got["embedding"]
    assert embedded["model"] == "minilm" and embedded["prompt_tokens"] > len(DOCUMENTS)
    np.testing.assert_allclose(embedded["vectors"], minilm_vectors(demo, DOCUMENTS), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["ollama_embedding"], embedded["vectors"], rtol=0, atol=1e-6)
    ranked = post(demo.url, "/v1/rerank", {"model": "rerank-tiny", "query": QUESTION, "documents": PASSAGES,
                                           "top_n": 3}).json()["results"]
    for provider, results in got["rerank"].items():
        # mlxd's own order and scores, whichever provider's shape litellm read them in.
        assert [r["index"] for r in results] == [r["index"] for r in ranked], provider
        assert [r["relevance_score"] for r in results] == pytest.approx([r["relevance_score"] for r in ranked])
        documents = [PASSAGES[r["index"]] for r in ranked] if provider != "infinity" else [None] * 3
        assert [r["document"] for r in results] == documents, provider
    # The same bytes as /v1/audio/speech makes for the text (seeded), and their
    # transcript as mlxd's own (litellm asks for verbose_json, for its duration).
    wav = base64.b64decode(got["speech"])
    assert wav[:4] == b"RIFF" and wav == post(demo.url, "/v1/audio/speech", {
        "model": "tts-1", "input": QUESTION, "voice": "alloy", "response_format": "wav"}).content
    heard = httpx.post(demo.url + "/v1/audio/transcriptions", data={"model": "whisper-1",
                       "response_format": "verbose_json"}, files={"file": ("said.wav", wav)}, timeout=120)
    assert heard.status_code == 200 and got["transcription"] == heard.json()["text"] != ""
