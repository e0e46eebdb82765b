"""What a client writes must not become a metric series: a glob alias
answers to any name that matches it, and each such name used to be a new
`model` label (and a new usage row, kept in sqlite) on the embedding,
rerank and audio routes. Every kind counts under its entry, as chat does."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest
from monitoring.monitoring_support import scrape

from mlxd.factory.audio import build_soprano
from mlxd.factory.encoders import EncoderRecipe, build_encoder
from support.daemon import Daemon, daemon_in_thread, wait_until, write_registry

MADE_UP = ("emb-1", "emb-2", "rr-1", "rr-2", "voice-1", "voice-2", "gpt-1", "gpt-2")


@pytest.fixture(scope="module")
def kinds_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One entry of each kind whose route counts requests, each under a glob alias."""
    tmp = tmp_path_factory.mktemp("labels")
    registry = write_registry(tmp, [
        {"name": "embed", "path": str(build_encoder(EncoderRecipe("embedding"))), "kind": "embedding",
         "aliases": ["emb-*"]},
        {"name": "rerank", "path": str(build_encoder(EncoderRecipe("rerank"))), "kind": "rerank",
         "aliases": ["rr-*"]},
        {"name": "soprano", "path": str(build_soprano()), "kind": "speech", "aliases": ["voice-*"]},
        {"name": "chat", "model": "qwen", "aliases": ["gpt-*"]},
    ])
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon


def _send(http: httpx.Client, name: str, headers: dict[str, str] | None = None) -> httpx.Response:
    if name.startswith("emb-"):
        return http.post("/v1/embeddings", json={"model": name, "input": "a sentence"}, headers=headers)
    if name.startswith("rr-"):
        return http.post("/v1/rerank", json={"model": name, "query": "q", "documents": ["a", "b"]}, headers=headers)
    if name.startswith("voice-"):
        return http.post("/v1/audio/speech", json={"model": name, "input": "Hello.", "response_format": "pcm"},
                         headers=headers)
    return http.post("/v1/chat/completions", headers=headers,
                     json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def test_names_a_glob_alias_matches_count_under_their_entry_on_every_route(kinds_daemon):
    with kinds_daemon.client() as http:
        for name in MADE_UP:
            answer = _send(http, name)
            assert answer.status_code == 200, (name, answer.text)
    entries = {"embed", "rerank", "soprano", "chat"}

    def counted() -> dict:
        samples = scrape(kinds_daemon)
        total = sum(v for (name, _), v in samples.items() if name == "mlxd_requests_total")
        return samples if total == len(MADE_UP) else {}

    samples = wait_until(counted, timeout=10)  # a speech stream is counted just after its last byte
    labelled = {dict(labels).get("model") for _, labels in samples} - {None}
    assert not labelled & set(MADE_UP), sorted(labelled & set(MADE_UP))
    for m in entries:
        assert samples[("mlxd_requests_total", frozenset({("model", m), ("status", "200")}))] == 2, m
    usage = {(u["model"], u["requests"]) for u in kinds_daemon.status()["usage"]}
    assert usage == {(m, 2) for m in entries}


def test_every_kinds_request_log_line_names_the_entry_and_the_request(kinds_daemon, caplog):
    """One line per request on every route, which finds its X-Request-Id (and so its row)."""
    caplog.set_level(logging.INFO, logger="mlxd.requests")
    with kinds_daemon.client() as http:
        for name in ("emb-9", "rr-9", "voice-9", "gpt-9"):
            sent = _send(http, name, headers={"X-Request-Id": f"line-{name}"})
            assert sent.status_code == 200, sent.text

    def lines() -> dict[str, list[str]]:
        found = {name: [r.getMessage() for r in caplog.records if f"request_id=line-{name}" in r.getMessage()]
                 for name in ("emb-9", "rr-9", "voice-9", "gpt-9")}
        return found if all(found.values()) else {}

    found = wait_until(lines, timeout=10)
    for name, entry in (("emb-9", "embed"), ("rr-9", "rerank"), ("voice-9", "soprano"), ("gpt-9", "chat")):
        (line,) = found[name]
        assert f"model={entry} status=200" in line, line
