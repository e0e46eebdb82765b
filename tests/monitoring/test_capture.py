"""Capture against a real daemon: off by default, admin only, and for a
prompt that parts from the cached one it says where and shows both texts."""

from __future__ import annotations

import httpx
import pytest
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx

ADMIN = "sk-admin-capture"
READER = "sk-reader-capture"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READER}"}
USER = {"role": "user", "content": "Read the configuration file and report the errors you find in it"}


def system(day: str) -> dict:
    return {"role": "system", "content": f"You are a careful assistant. Today is {day}. Answer briefly and plainly."}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture")
    registry = write_registry(tmp, [{"name": "qwen", "model": "qwen"}, {"name": "llama", "model": "llama"}],
                              server={"read_only_keys": [READER]})
    with daemon_in_thread(registry, tmp, api_keys=ADMIN) as d:
        yield d


def ask(daemon, messages, request_id: str, model: str = "qwen") -> httpx.Response:
    body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
    return httpx.post(f"{daemon.url}/v1/chat/completions", json=body,
                      headers={**AS_ADMIN, "X-Request-Id": request_id}, timeout=60)


def captured(daemon, request_id: str) -> httpx.Response:
    return httpx.get(f"{daemon.url}/v1/captures/{request_id}", headers=AS_ADMIN)


def test_nothing_is_captured_until_an_admin_turns_it_on(daemon):
    assert httpx.get(f"{daemon.url}/v1/capture", headers=AS_ADMIN).json()["enabled"] is False
    assert ask(daemon, [USER], "before-capture").status_code == 200
    assert captured(daemon, "before-capture").status_code == 404
    for method, path in (("GET", "/v1/capture"), ("PUT", "/v1/capture"), ("GET", "/v1/captures")):
        refused = httpx.request(method, f"{daemon.url}{path}", json={"enabled": True}, headers=AS_READER)
        assert refused.status_code == 403, path
    unknown = httpx.put(f"{daemon.url}/v1/capture", json={"enabled": True, "models": ["nope"]}, headers=AS_ADMIN)
    assert unknown.status_code == 404


def test_a_diverged_prompt_shows_where_it_parted_from_the_cached_one(daemon):
    settings = httpx.put(f"{daemon.url}/v1/capture", json={"enabled": True, "models": ["qwen"]}, headers=AS_ADMIN)
    assert settings.json()["models"] == ["qwen"] and settings.json()["all_models"] is False
    first = ask(daemon, [system("Monday"), USER], "turn-1")
    again = ask(daemon, [system("Monday"), USER], "turn-2")
    moved = ask(daemon, [system("Tuesday"), USER], "turn-3")
    assert first.status_code == again.status_code == moved.status_code == 200

    one = captured(daemon, "turn-1").json()
    assert "Today is Monday" in one["prompt"] and "<|im_start|>" in one["prompt"], "the prompt as templated"
    assert one["output"] == first.json()["choices"][0]["message"]["content"]
    assert one["cache"]["reason"] in ("no_entry", "diverged", "template_change")

    two = captured(daemon, "turn-2").json()
    assert two["cache"]["reason"] == "prefix_hit" and two["cache"]["hit_tokens"] > 0
    assert two["cache"]["hit_tokens"] == again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    three = captured(daemon, "turn-3").json()
    decision = three["cache"]
    assert decision["reason"] == "diverged", decision
    assert "Monday" in decision["entry_text"] and "Tuesday" in decision["prompt_text"]
    assert 0 < decision["diverged_at"] < decision["prompt_tokens"]
    assert decision["hit_tokens"] == moved.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Found by the response object's id as well; listed newest first; other models not captured.
    assert captured(daemon, moved.json()["id"]).json()["request_id"] == "turn-3"
    listed = httpx.get(f"{daemon.url}/v1/captures", headers=AS_ADMIN).json()["data"]
    assert [c["request_id"] for c in listed[:3]] == ["turn-3", "turn-2", "turn-1"]
    assert ask(daemon, [USER], "other-model", model="llama").status_code == 200
    assert captured(daemon, "other-model").status_code == 404
    off = httpx.put(f"{daemon.url}/v1/capture", json={"enabled": False}, headers=AS_ADMIN).json()
    assert off["enabled"] is False and off["captured"] >= 3
