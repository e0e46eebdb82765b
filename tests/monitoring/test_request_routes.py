"""X-Request-Id on every response, cancelling a request by id (a stream
ends cleanly with its usage and frees its slot; a queued request leaves the
queue), and the seed's cache routes, against a real daemon with tiny
models. Changing anything needs an admin key."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from monitoring.monitoring_support import CHAT, chat, sample, scrape
from support.daemon import daemon_in_thread, wait_until, write_registry

pytestmark = pytest.mark.mlx

ADMIN = "sk-admin-routes"
READER = "sk-reader-routes"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READER}"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    registry = write_registry(
        tmp,
        [
            {"name": "qwen", "model": "qwen", "max_concurrency": 1},
            {"name": "llama", "model": "llama", "max_concurrency": 4},
        ],
        server={"read_only_keys": [READER]},
    )
    with daemon_in_thread(registry, tmp, api_keys=ADMIN) as d:
        yield d


def _name(key: str) -> str:
    import hashlib

    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]


def _model(daemon, name: str) -> dict:
    return next(m for m in httpx.get(f"{daemon.url}/v1/status", headers=AS_ADMIN).json()["models"] if m["name"] == name)


def test_every_response_names_its_request(daemon):
    answer = chat(daemon, "llama", headers=AS_ADMIN)
    assert answer.status_code == 200 and answer.headers["x-request-id"].startswith("req_")
    mine = chat(daemon, "llama", headers={**AS_ADMIN, "X-Request-Id": "turn-42/abc"})
    assert mine.headers["x-request-id"] == "turn-42/abc"
    # Refused before any route, still named; a header that cannot be echoed is replaced.
    refused = httpx.get(f"{daemon.url}/v1/status", headers={"X-Request-Id": "two words"})
    assert refused.status_code == 401 and refused.headers["x-request-id"].startswith("req_")
    assert httpx.get(f"{daemon.url}/health").headers["x-request-id"]
    first, second = (chat(daemon, "nope", headers=AS_ADMIN).headers["x-request-id"] for _ in range(2))
    assert first != second


class Stream:
    """A streamed chat read on a thread, so the test can act while it runs."""

    def __init__(self, daemon, model: str, headers: dict, max_tokens: int = 3000) -> None:
        self.events: list[dict] = []
        self.lines: list[str] = []
        self.status: int | None = None
        self.request_id = ""
        self.ended_at = 0.0
        body = {"model": model, "messages": CHAT, "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        self._thread = threading.Thread(target=self._read, args=(daemon, body, headers), daemon=True)
        self._thread.start()

    def _read(self, daemon, body, headers) -> None:
        with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            self.status = r.status_code
            self.request_id = r.headers["x-request-id"]
            for line in r.iter_lines():
                if line:
                    self.lines.append(line)
                if line.startswith("data: {"):
                    self.events.append(json.loads(line[6:]))
        self.ended_at = time.monotonic()

    def join(self) -> None:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def test_a_cancelled_stream_ends_cleanly_with_its_usage_and_frees_its_slot(daemon):
    stream = Stream(daemon, "qwen", AS_ADMIN)
    wait_until(lambda: len(stream.events) >= 5, timeout=30)
    response_id = stream.events[0]["id"]
    # The response object's own id finds it, as well as the X-Request-Id.
    cancelled = httpx.post(f"{daemon.url}/v1/requests/{response_id}/cancel", headers=AS_ADMIN)
    asked_at = time.monotonic()
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json() == {"object": "request.cancel", "id": response_id, "cancelled": True, "model": "qwen"}
    stream.join()
    assert stream.ended_at - asked_at < 2.0
    assert stream.lines[-1] == "data: [DONE]"
    finals = [e for e in stream.events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [e["choices"][0]["finish_reason"] for e in finals] == ["stop"]
    usage = stream.events[-1]["usage"]
    assert 0 < usage["completion_tokens"] < 3000 and usage["prompt_tokens"] > 0
    wait_until(lambda: _model(daemon, "qwen")["active_leases"] == 0, timeout=5)
    generated = _model(daemon, "qwen")["engine"]["tokens_generated"]
    time.sleep(0.5)
    assert _model(daemon, "qwen")["engine"]["tokens_generated"] == generated, "the engine stopped generating"
    # Gone: a second cancel finds nothing.
    assert httpx.delete(f"{daemon.url}/v1/requests/{response_id}", headers=AS_ADMIN).status_code == 404


def test_a_whole_answer_cancelled_by_its_id_returns_what_it_had_so_far(daemon):
    outcome: dict = {}
    body = {"model": "qwen", "messages": CHAT, "max_tokens": 3000, "ignore_eos": True}

    def ask() -> None:
        outcome["r"] = httpx.post(f"{daemon.url}/v1/chat/completions", json=body,
                                  headers={**AS_ADMIN, "X-Request-Id": "whole-one"}, timeout=60)
        outcome["at"] = time.monotonic()

    def first_tokens() -> float:
        return sample(scrape(daemon, AS_ADMIN), "mlxd_time_to_first_token_seconds_count", model="qwen") or 0

    before = first_tokens()
    asker = threading.Thread(target=ask)
    asker.start()
    wait_until(lambda: first_tokens() > before, timeout=30)
    time.sleep(0.3)  # a few more tokens
    assert httpx.post(f"{daemon.url}/v1/requests/whole-one/cancel", headers=AS_ADMIN).status_code == 200
    asked_at = time.monotonic()
    asker.join(timeout=10)
    answer = outcome["r"]
    assert answer.status_code == 200, answer.text
    assert outcome["at"] - asked_at < 2.0
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"]
    usage = answer.json()["usage"]
    assert 1 <= usage["completion_tokens"] < 3000 and usage["prompt_tokens"] > 0
    wait_until(lambda: _model(daemon, "qwen")["active_leases"] == 0, timeout=5)


def test_a_queued_request_cancelled_by_its_id_leaves_the_queue(daemon):
    running = Stream(daemon, "qwen", AS_ADMIN)
    wait_until(lambda: len(running.events) >= 2, timeout=30)
    outcome: dict = {}

    def queued() -> None:
        body = {"model": "qwen", "messages": CHAT, "max_tokens": 4}
        outcome["r"] = httpx.post(f"{daemon.url}/v1/chat/completions", json=body,
                                  headers={**AS_ADMIN, "X-Request-Id": "waiting-one"}, timeout=60)

    waiter = threading.Thread(target=queued)
    waiter.start()
    wait_until(lambda: _model(daemon, "qwen")["queued"] == 1, timeout=10)
    assert httpx.delete(f"{daemon.url}/v1/requests/waiting-one", headers=AS_ADMIN).status_code == 200
    waiter.join(timeout=10)
    answer = outcome["r"]
    assert answer.status_code == 499 and answer.json()["error"]["code"] == "request_cancelled"
    assert answer.headers["x-request-id"] == "waiting-one"
    assert _model(daemon, "qwen")["queued"] == 0
    assert httpx.post(f"{daemon.url}/v1/requests/{running.request_id}/cancel", headers=AS_ADMIN).status_code == 200
    running.join()


def test_requests_under_way_say_which_waits_for_a_slot_and_which_decodes(daemon):
    """"Why is my request slow right now?": /v1/requests tells a request
    queued behind another (qwen serves one at a time) from one decoding."""
    running = Stream(daemon, "qwen", AS_ADMIN)
    wait_until(lambda: len(running.events) >= 2, timeout=30)
    waiter = threading.Thread(target=lambda: httpx.post(
        f"{daemon.url}/v1/chat/completions", json={"model": "qwen", "messages": CHAT, "max_tokens": 4},
        headers={**AS_ADMIN, "X-Request-Id": "behind-one"}, timeout=60))
    waiter.start()
    wait_until(lambda: _model(daemon, "qwen")["queued"] == 1, timeout=10)
    under_way = {r["id"]: r for r in httpx.get(f"{daemon.url}/v1/requests", headers=AS_ADMIN).json()["data"]}
    assert under_way["behind-one"]["phase"] == "queued" and under_way["behind-one"]["tokens_out"] == 0
    assert under_way[running.request_id]["phase"] == "decode" and under_way[running.request_id]["tokens_out"] > 0
    assert httpx.post(f"{daemon.url}/v1/requests/{running.request_id}/cancel", headers=AS_ADMIN).status_code == 200
    running.join()
    waiter.join(timeout=30)


def test_a_read_only_key_changes_nothing_and_cancels_only_its_own(daemon):
    for method, path in (("POST", "/v1/models/llama/unload"), ("POST", "/v1/models/llama/load"),
                         ("POST", "/v1/models/llama/pin"), ("POST", "/v1/models/llama/unpin"),
                         ("POST", "/v1/admin/reload"), ("DELETE", "/v1/cache/prefix"), ("DELETE", "/v1/cache")):
        refused = httpx.request(method, f"{daemon.url}{path}", json={}, headers=AS_READER)
        assert refused.status_code == 403, (path, refused.text)
        assert "admin key" in refused.json()["error"]["message"]
    assert httpx.get(f"{daemon.url}/v1/cache/stats", headers=AS_READER).status_code == 200
    assert httpx.get(f"{daemon.url}/v1/caller", headers=AS_READER).json() == {"key": _name(READER), "admin": False}
    assert httpx.get(f"{daemon.url}/v1/caller", headers=AS_ADMIN).json() == {"key": _name(ADMIN), "admin": True}

    theirs = Stream(daemon, "llama", AS_ADMIN)
    mine = Stream(daemon, "llama", AS_READER)
    wait_until(lambda: len(theirs.events) >= 2 and len(mine.events) >= 2, timeout=30)
    listed = httpx.get(f"{daemon.url}/v1/requests", headers=AS_READER).json()["data"]
    assert [e["id"] for e in listed] == [mine.request_id]
    assert httpx.post(f"{daemon.url}/v1/requests/{theirs.request_id}/cancel", headers=AS_READER).status_code == 404
    assert httpx.post(f"{daemon.url}/v1/requests/{mine.request_id}/cancel", headers=AS_READER).status_code == 200
    mine.join()
    assert theirs.ended_at == 0.0, "the other key's stream runs on"
    assert httpx.post(f"{daemon.url}/v1/requests/{theirs.request_id}/cancel", headers=AS_ADMIN).status_code == 200
    theirs.join()


def test_cache_routes_answer_in_the_seeds_shapes_per_model(daemon):
    for _ in range(2):  # the second turn reuses the first one's prefix
        assert chat(daemon, "llama", headers=AS_ADMIN, temperature=0).status_code == 200
    stats = httpx.get(f"{daemon.url}/v1/cache/stats", headers=AS_ADMIN).json()
    assert stats["object"] == "cache.stats" and {m["model"] for m in stats["models"]} == {"qwen", "llama"}
    llama = next(m for m in stats["models"] if m["model"] == "llama")
    assert llama["engine_cache"]["memory_entries"] >= 1 and llama["engine_cache"]["hits"] >= 1
    assert stats["engine_cache"]["hits"] >= llama["engine_cache"]["hits"]
    one = httpx.get(f"{daemon.url}/v1/cache/stats?model=llama", headers=AS_ADMIN).json()
    assert [m["model"] for m in one["models"]] == ["llama"]

    unknown = httpx.delete(f"{daemon.url}/v1/cache/prefix?model=nope", headers=AS_ADMIN)
    assert unknown.status_code == 404 and "llama" in unknown.json()["error"]["message"]
    cleared = httpx.delete(f"{daemon.url}/v1/cache/prefix?model=llama", headers=AS_ADMIN).json()
    assert cleared == {"status": "cleared", "rewarm_scheduled": False, "models": [{"model": "llama", "status": "cleared"}]}
    after = httpx.get(f"{daemon.url}/v1/cache/stats?model=llama", headers=AS_ADMIN).json()
    assert after["models"][0]["engine_cache"]["memory_entries"] == 0

    everything = httpx.delete(f"{daemon.url}/v1/cache", headers=AS_ADMIN).json()
    assert everything["status"] == "cleared" and everything["caches"] == ["prefix", "mlx_buffers"]
    assert {m["model"] for m in everything["engine_cache"]["models"]} == {"qwen", "llama"}


def test_pinning_holds_a_model_until_unpinned(daemon):
    assert chat(daemon, "llama", headers=AS_ADMIN).status_code == 200
    pinned = httpx.post(f"{daemon.url}/v1/models/llama/pin", json={}, headers=AS_ADMIN)
    assert pinned.json() == {"model": "llama", "pinned": True, "state": "loaded"}
    llama = _model(daemon, "llama")
    assert llama["pinned"] is True and llama["idle_unload_at"] is None
    assert httpx.post(f"{daemon.url}/v1/models/llama/unpin", json={}, headers=AS_ADMIN).json()["pinned"] is False
    assert _model(daemon, "llama")["pinned"] is False
    unknown = httpx.post(f"{daemon.url}/v1/models/nope/pin", json={}, headers=AS_ADMIN)
    assert unknown.status_code == 404


def test_a_cancelled_anthropic_stream_ends_with_its_stop_and_usage(daemon):
    # Greedy from a cold prompt cache, so the random model's answer is always the
    # same long one. Sampled (Messages' default is the 0.7 fallback, unseeded) it
    # could reach its end-of-turn token before the cancel, which then found no
    # request: a full CI run's 404.
    cleared = httpx.delete(f"{daemon.url}/v1/cache/prefix", params={"model": "llama"}, headers=AS_ADMIN, timeout=30)
    assert cleared.status_code == 200, cleared.text
    events: list[str] = []
    body = {"model": "llama", "max_tokens": 3000, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Read the configuration file and report the errors"}]}

    def read() -> None:
        with httpx.stream("POST", f"{daemon.url}/v1/messages", json=body, timeout=60,
                          headers={"x-api-key": ADMIN, "X-Request-Id": "claude-turn"}) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    reader = threading.Thread(target=read)
    reader.start()
    wait_until(lambda: sum('"text_delta"' in e for e in events) >= 3, timeout=30)
    assert httpx.post(f"{daemon.url}/v1/requests/claude-turn/cancel", headers=AS_ADMIN).status_code == 200
    reader.join(timeout=10)
    assert not reader.is_alive()
    kinds = [json.loads(e[6:])["type"] for e in events]
    assert kinds[-2:] == ["message_delta", "message_stop"] and "error" not in kinds
    delta = json.loads(events[-2][6:])
    assert delta["delta"]["stop_reason"] == "end_turn" and 0 < delta["usage"]["output_tokens"] < 3000
