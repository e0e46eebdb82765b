"""A backend that breaks off its answer. A whole (non-stream) answer has
sent the client nothing yet, so the next target serves it; a stream that
began cannot be taken back (tests/failover/test_failover_e2e.py)."""

from __future__ import annotations

import httpx
import pytest

from support.bad_backend import BadBackend
from support.daemon import daemon_in_thread
from support.remote import write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]


def test_a_whole_answer_broken_off_by_a_backend_is_served_by_the_next_target(tmp_path):
    with BadBackend().running() as backend:
        models = [
            {"name": "here", "model": "qwen"},
            {"name": "flaky", "backend": "bad", "remote_model": "broken_off"},
            {"name": "fo", "targets": ["flaky", "here"], "strategy": "spillover"},
        ]
        backends = {"bad": {"url": backend.url, "poll_interval_s": 300}}
        with daemon_in_thread(write_front(tmp_path / "front", backends, models), tmp_path) as front:
            answer = httpx.post(f"{front.url}/v1/chat/completions", timeout=120, json={
                "model": "fo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
            entry = next(f for f in front.status()["failover"] if f["name"] == "fo")
    assert answer.status_code == 200, answer.text  # on the old code: 502
    assert "Half an ans" not in answer.json()["choices"][0]["message"]["content"]
    assert entry["recent"][-1]["target"] == "here"
    flaky = next(t for t in entry["targets"] if t["name"] == "flaky")
    assert flaky["fell_through"] == 1 and "broke off the answer" in flaky["last_error"]
    assert backend.generations() == ["broken_off"]
