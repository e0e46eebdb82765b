"""An app's priority, limits and usage on the kinds of work beside
generation, on the factory's tiny random encoders and Whisper behind one
daemon: embeddings, rerank, transcription and speech requests count in
their app's requests per minute and usage, their tokens (inputs read, a
transcript's text tokens) in its token limits, and the caller's priority
class reaches each kind's queue."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from mlxd.engine.audio_files import write_file
from mlxd.factory.audio import build_soprano, build_whisper
from mlxd.factory.encoders import EncoderRecipe, build_encoder
from support.daemon import daemon_in_thread, holding_the_worker, wait_until, write_registry

pytestmark = pytest.mark.mlx
RAG, EDITOR, READER = "sk-rag-kinds", "sk-editor-kinds", "sk-reader-kinds"
DAY = 100_000
RATE = 16000
# Half a second of a 200 Hz -> 2 kHz sweep.
_T = np.arange(RATE // 2) / RATE
CLIP = write_file((0.3 * np.sin(2 * np.pi * (200 + 1800 * _T) * _T)).astype(np.float32), RATE, "wav")


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("app-kinds")
    path = write_registry(tmp, [
        {"name": "embed", "path": str(build_encoder(EncoderRecipe("embedding"))), "kind": "embedding",
         "preload": True},
        {"name": "rerank", "path": str(build_encoder(EncoderRecipe("rerank"))), "kind": "rerank"},
        {"name": "whisper", "path": str(build_whisper()), "kind": "transcription", "preload": True},
        # (Speech is counted by the same code as transcription; here only its route's limit is asked.)
        {"name": "soprano", "path": str(build_soprano()), "kind": "speech", "aliases": ["tts-*"]},
    ])
    path.write_text(path.read_text() + (
        "apps:\n"
        f"  - {{name: rag, key_sha256: {_sha(RAG)}, priority: bulk, rpm: 5, tokens_per_day: {DAY}}}\n"
        f"  - {{name: editor, key_sha256: {_sha(EDITOR)}, priority: interactive}}\n"
        # Scoped to the speech model by its alias.
        f"  - {{name: reader, key_sha256: {_sha(READER)}, models: [tts-*], routes: [audio]}}\n"
    ))
    with daemon_in_thread(path, tmp) as d:
        wait_until(lambda: all(d.ctx.manager.view(m).state.value == "loaded" for m in ("embed", "whisper")),
                   timeout=120)
        # The limits' clock, turned by the tests.
        d.now = [1_700_000_000.0]
        d.ctx.limits.clock = lambda: d.now[0]
        yield d


def _headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def embed(d: Any, key: str, texts: list[str]) -> httpx.Response:
    return httpx.post(d.url + "/v1/embeddings", json={"model": "embed", "input": texts}, headers=_headers(key),
                      timeout=60)


def rerank(d: Any, key: str) -> httpx.Response:
    body = {"model": "rerank", "query": "where do cats sleep", "documents": ["on the mat", "in the stock market"]}
    return httpx.post(d.url + "/v1/rerank", json=body, headers=_headers(key), timeout=60)


def transcribe(d: Any, key: str) -> httpx.Response:
    return httpx.post(d.url + "/v1/audio/transcriptions", files={"file": ("a.wav", CLIP)},
                      data={"model": "whisper", "temperature": "0.4", "response_format": "verbose_json"},
                      headers=_headers(key), timeout=120)


def speak(d: Any, key: str) -> httpx.Response:
    return httpx.post(d.url + "/v1/audio/speech", json={"model": "soprano", "input": "Hi.", "response_format": "pcm"},
                      headers=_headers(key), timeout=120)


def day_left(answer: httpx.Response) -> int:
    return int(answer.headers["x-ratelimit-remaining-tokens-day"])


def test_an_app_scoped_to_a_speech_models_alias_lists_its_voices(daemon):
    """The voices list matched an app's globs against the model's name only,
    so an app that may speak through `tts-*` listed no voice of it."""
    listed = httpx.get(daemon.url + "/v1/audio/voices", headers=_headers(READER), timeout=60)
    assert listed.status_code == 200, listed.text
    assert {v["model"] for v in listed.json()["data"]} == {"soprano"}
    assert speak(daemon, READER).status_code == 200


def test_every_kind_counts_in_its_apps_requests_per_minute_token_day_and_usage(daemon):
    embedded = embed(daemon, RAG, ["a cat sits on the mat", "a kitten rests"])
    assert embedded.status_code == 200, embedded.text
    embed_tokens = embedded.json()["usage"]["prompt_tokens"]
    ranked = rerank(daemon, RAG)
    assert ranked.status_code == 200, ranked.text
    assert day_left(ranked) == DAY - embed_tokens, "the embedded inputs count toward the day"
    heard = transcribe(daemon, RAG)
    assert heard.status_code == 200, heard.text
    rerank_tokens = DAY - embed_tokens - day_left(heard)
    assert rerank_tokens > 0, "the query and documents read count toward the day"
    transcript_tokens = sum(len(s["tokens"]) for s in heard.json()["segments"])
    assert transcript_tokens > 0, "the random Whisper writes a few tokens"
    again = embed(daemon, RAG, ["one more"])
    assert again.status_code == 200
    assert day_left(again) == DAY - embed_tokens - rerank_tokens - transcript_tokens, "so does a transcript"
    assert again.headers["x-ratelimit-remaining-requests"] == "1"
    assert rerank(daemon, RAG).status_code == 200
    for ask in (lambda: embed(daemon, RAG, ["x"]), lambda: rerank(daemon, RAG), lambda: transcribe(daemon, RAG),
                lambda: speak(daemon, RAG)):
        refused = ask()
        assert refused.status_code == 429, refused.text
        assert refused.headers["x-ratelimit-limit-requests"] == "5" and "retry-after" in refused.headers
        assert "over its limit of 5 requests per minute (`rpm`)" in refused.json()["error"]["message"]
    usage = {u["model"]: u for u in httpx.get(daemon.url + "/v1/status", headers=_headers(RAG)).json()["usage"]
             if u["app"] == "rag"}
    assert usage["embed"]["tokens_in"] > embed_tokens and usage["rerank"]["tokens_in"] == 2 * rerank_tokens
    assert usage["whisper"]["tokens_out"] == transcript_tokens
    assert [usage[m]["requests"] for m in ("embed", "rerank", "whisper")] == [2, 2, 1]
    # Refused at the gate, before their bodies were read: errors of the app, on no model.
    assert usage[""]["errors"] >= 4
    daemon.now[0] += 60
    assert embed(daemon, RAG, ["x"]).status_code == 200, "the minute passed"


def test_every_kinds_request_log_line_names_its_app(daemon, caplog):
    caplog.set_level(logging.INFO, logger="mlxd.requests")
    for ask, what in ((lambda: embed(daemon, EDITOR, ["x"]), "embeddings"), (lambda: rerank(daemon, EDITOR), "rerank"),
                      (lambda: transcribe(daemon, EDITOR), "transcribe")):
        assert ask().status_code == 200
        lines = [r.getMessage() for r in caplog.records if r.name == "mlxd.requests"]
        assert " caller=editor " in [line for line in lines if line.startswith(what + " ")][-1] + " ", lines


def test_the_callers_priority_reaches_the_encoders_batch_queue_and_the_audio_models_queue(daemon):
    daemon.now[0] += 3600
    encoder = daemon.ctx.manager._models["embed"].engine
    core = daemon.ctx.manager.core
    before = encoder.stats()["requests"]
    with ThreadPoolExecutor(7) as pool:
        busy, gate = holding_the_worker(daemon, pool)
        # On CUDA the encoder's passes after its first run on a thread of their own: held too.
        apart = encoder._pass_thread
        busy_apart, gate_apart = holding_the_worker(daemon, pool, apart) if apart is not None else (None, gate)
        try:
            # The first batch waits on the worker; what comes next waits in the batch queue.
            first = pool.submit(embed, daemon, RAG, ["the first batch"])
            wait_until(lambda: encoder.stats()["requests"] == before + 1 and len(encoder._queue) == 0)
            more = pool.submit(embed, daemon, RAG, ["bulk input"] * 3)
            query = pool.submit(embed, daemon, EDITOR, ["an editor's query"])
            wait_until(lambda: len(encoder._queue) == 4)
            waiting = {c: len(rows) for c, rows in encoder._queue._waiting.items() if rows}
            assert waiting == {"bulk": 3, "interactive": 1}, "each input queued with its caller's class"
            # One transcription holds Whisper's slot; the next ones queue with their class.
            heard = pool.submit(transcribe, daemon, RAG)
            wait_until(lambda: core.residents["whisper"].active == 1)
            later = pool.submit(transcribe, daemon, EDITOR)
            wait_until(lambda: [w.priority for w in core.waiters if w.model == "whisper"] == ["interactive"])
        finally:
            gate.set()
            gate_apart.set()
        busy.result()
        if busy_apart is not None:
            busy_apart.result()
        assert all(f.result().status_code == 200 for f in (first, more, query, heard, later))
