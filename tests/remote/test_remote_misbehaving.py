"""A front `mlxd serve` in front of a backend that breaks the protocol on
purpose (tests/support/bad_backend.py): a gzip bomb, a line with no end,
tool calls at absurd indices, negative usage, headers and then silence,
garbage, a redirect, a 500 with a huge body. The front answers each with a
clean status or a clean end of stream, never a 500 or a cut body, stays
responsive meanwhile, and a failover entry moves on from such a target."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from support.bad_backend import BadBackend
from support.daemon import daemon_process
from support.remote import sse_events, write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "hi"}]
BEHAVIOURS = ("bomb", "huge_line", "tool_indices", "negative_usage", "silent", "garbage", "reasoning",
              "redirect", "server_error")
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("first", "second", "third")]


@pytest.fixture(scope="module")
def catcher():
    """Where the redirect points: it must never see the prompt."""
    with BadBackend().running() as server:
        yield server


@pytest.fixture(scope="module")
def bad(catcher):
    with BadBackend(redirect_to=catcher.url).running() as server:
        yield server


@pytest.fixture(scope="module")
def front(bad, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    backends = {"bad": {"url": bad.url, "timeouts": {"connect": 2, "first_byte": 2, "idle": 1}, "poll_interval_s": 300}}
    models = [{"name": b, "backend": "bad", "remote_model": b} for b in BEHAVIOURS]
    models += [
        {"name": "here", "model": "qwen"},
        {"name": "fo-silent", "targets": ["silent", "here"], "strategy": "spillover"},
        {"name": "fo-garbage", "targets": ["garbage", "here"], "strategy": "spillover"},
    ]
    with daemon_process(write_front(tmp, backends, models), tmp) as daemon:
        yield daemon


def chat(front, model, stream=False, **body):
    return httpx.post(f"{front.url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": MESSAGES, "max_tokens": 8, "stream": stream, **body})


def no_internals(response):
    message = response.json()["error"]["message"]
    assert "127.0.0.1" not in message and "http://" not in message and "<" not in message, message
    return message


@pytest.mark.parametrize("model", ["bomb", "huge_line"])
def test_an_endless_line_is_a_502_and_the_front_keeps_serving_meanwhile(front, model):
    results: list[httpx.Response] = []

    def ask(stream: bool) -> None:
        results.append(chat(front, model, stream=stream))

    askers = [threading.Thread(target=ask, args=(i % 2 == 1,)) for i in range(4)]
    for asker in askers:
        asker.start()
    slowest = 0.0
    while any(a.is_alive() for a in askers):
        began = time.monotonic()
        assert httpx.get(f"{front.url}/health", timeout=10).status_code == 200
        slowest = max(slowest, time.monotonic() - began)
        time.sleep(0.02)
    for asker in askers:
        asker.join()
    assert slowest < 2.0, f"/health took {slowest:.1f} s while the backend sent one endless line"
    assert [r.status_code for r in results] == [502] * 4, "streams too: nothing was accepted yet"
    for response in results:
        assert "sent an event larger than 8 MiB" in no_internals(response)
        assert response.headers["retry-after"] == "5"
    assert chat(front, "here").status_code == 200


def test_parallel_calls_turned_off_answer_one_call_from_a_backend_that_sends_three(front):
    # The backend ignores parallel_tool_calls: false; its three calls all reached the client.
    answer = chat(front, "tool_indices", tools=TOOLS, parallel_tool_calls=False)
    assert answer.status_code == 200, answer.text
    calls = answer.json()["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("first", '{"a": 1}')]
    assert answer.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_calls_at_absurd_indices_are_renumbered_and_never_invented(front):
    answer = chat(front, "tool_indices", tools=TOOLS)
    assert answer.status_code == 200, answer.text
    calls = answer.json()["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("first", '{"a": 1}'), ("second", "{}"), ("third", "{}")]
    assert all(c["id"] for c in calls)

    with httpx.stream("POST", f"{front.url}/v1/chat/completions", timeout=30, json={
            "model": "tool_indices", "messages": MESSAGES, "tools": TOOLS, "stream": True}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    assert events[-1] == "[DONE]"
    indices = [d["index"] for e in events[:-1] for c in e["choices"] for d in c["delta"].get("tool_calls", [])]
    assert sorted(set(indices)) == [0, 1, 2]

    with httpx.stream("POST", f"{front.url}/v1/responses", timeout=30, json={
            "model": "tool_indices", "input": "hi", "stream": True,
            "tools": [{"type": "function", "name": t["function"]["name"], "parameters": {"type": "object"}}
                      for t in TOOLS]}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    done = events[-1]
    assert done["type"] == "response.completed"
    assert [i["name"] for i in done["response"]["output"] if i["type"] == "function_call"] == ["first", "second", "third"]

    with httpx.stream("POST", f"{front.url}/v1/messages", timeout=30, json={
            "model": "tool_indices", "max_tokens": 8, "messages": MESSAGES, "stream": True,
            "tools": [{"name": t["function"]["name"], "input_schema": {"type": "object"}} for t in TOOLS]}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    started = [e["index"] for e in events if e["type"] == "content_block_start"]
    deltas = [e["index"] for e in events if e["type"] == "content_block_delta"]
    assert set(deltas) <= set(started) and len(started) == 3
    assert events[-1]["type"] == "message_stop"
    assert "Traceback" not in front.log()


def test_negative_usage_counts_as_zero_and_the_stream_still_ends_with_done(front):
    with httpx.stream("POST", f"{front.url}/v1/chat/completions", timeout=30, json={
            "model": "negative_usage", "messages": MESSAGES, "stream": True,
            "stream_options": {"include_usage": True}}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    assert events[-1] == "[DONE]"
    assert not [e for e in events[:-1] if "error" in e]
    assert "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"]) == "Hi"
    usage = [e["usage"] for e in events[:-1] if e.get("usage")]
    assert usage and usage[-1]["prompt_tokens"] == 0 and usage[-1]["completion_tokens"] == 0
    whole = chat(front, "negative_usage")
    assert whole.status_code == 200 and whole.json()["usage"]["prompt_tokens"] == 0
    assert httpx.get(f"{front.url}/metrics", timeout=10).status_code == 200


def test_headers_then_silence_on_a_stream_is_a_real_504(front):
    response = chat(front, "silent", stream=True)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "backend_timeout"
    assert "backend `silent`" in no_internals(response) or "backend `bad`" in no_internals(response)


@pytest.mark.parametrize("stream", [False, True])
def test_garbage_first_is_a_real_502_with_retry_after(front, stream):
    response = chat(front, "garbage", stream=stream)
    assert response.status_code == 502
    assert response.headers["retry-after"] == "5"
    assert "Backend `bad` sent an answer that is not JSON" in no_internals(response)


@pytest.mark.parametrize("entry, target", [("fo-silent", "silent"), ("fo-garbage", "garbage")])
def test_a_failover_entry_falls_through_from_such_a_target_to_a_local_one(front, bad, entry, target):
    before = bad.generations().count(target)
    with httpx.stream("POST", f"{front.url}/v1/chat/completions", timeout=30, json={
            "model": entry, "messages": MESSAGES, "max_tokens": 4, "stream": True}) as stream:
        assert stream.status_code == 200
        events = sse_events(stream)
    assert events[-1] == "[DONE]" and not [e for e in events[:-1] if "error" in e]
    assert bad.generations().count(target) == before + 1, "the broken target was tried first"
    failover = next(f for f in front.status()["failover"] if f["name"] == entry)
    assert failover["recent"][-1] == {**failover["recent"][-1], "target": "here", "status": 200}
    broken = next(t for t in failover["targets"] if t["name"] == target)
    assert broken["fell_through"] >= 1 and "127.0.0.1" not in broken["last_error"]


def test_a_redirect_is_a_502_and_the_prompt_never_goes_where_it_points(front, catcher):
    for stream in (False, True):
        response = chat(front, "redirect", stream=stream)
        assert response.status_code == 502
        assert "answered with a redirect (307)" in no_internals(response)
    assert catcher.generations() == []


def test_reasoning_events_are_progress_not_silence(front):
    response = chat(front, "reasoning")  # 3 s of thinking: past first_byte (2 s), a gap never near idle (1 s)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "42"


def test_a_server_error_with_a_huge_body_is_a_generic_502(front):
    response = chat(front, "server_error")
    assert response.status_code == 502 and response.headers["retry-after"] == "5"
    assert no_internals(response) == "Backend `bad` failed (500)"
    assert "CUDA out of memory" in front.log(until="CUDA out of memory"), "the backend's own words are for the operator"
