"""A failover attempt must not leak into the next target's request. A
forced tool call drops the stop strings on a local target (they would cut
the call's JSON), but when that target cannot take the request (the prompt
does not fit its context) the next one, a remote backend, must still get the
client's stop strings as sent."""

from __future__ import annotations

import httpx
import pytest

from support.bad_backend import BadBackend
from support.daemon import daemon_in_thread, tiny_model
from support.remote import write_front
from tools.tool_models import with_template

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
# Far more than the cramped target's 64 tokens, far less than the backend's context.
LONG = "Tell me everything about the sea, the tides, the winds and the ships. " * 12


def test_the_next_target_gets_the_clients_stop_strings_after_a_forced_call_attempt(tmp_path):
    with BadBackend().running() as backend:
        tools_model = with_template(tiny_model("qwen"), tmp_path / "qwen-tools")
        models = [
            {"name": "cramped", "path": str(tools_model), "max_context": 64},
            {"name": "plain", "backend": "bad", "remote_model": "plain"},
            {"name": "fo", "targets": ["cramped", "plain"], "strategy": "spillover"},
        ]
        backends = {"bad": {"url": backend.url, "poll_interval_s": 300}}
        with daemon_in_thread(write_front(tmp_path / "front", backends, models), tmp_path) as front:
            answer = httpx.post(f"{front.url}/v1/chat/completions", timeout=120, json={
                "model": "fo", "messages": [{"role": "user", "content": LONG}], "max_tokens": 8,
                "tools": TOOLS, "tool_choice": "required", "stop": ["END", "\n\n"],
            })
            assert answer.status_code == 200, answer.text
            assert next(f for f in front.status()["failover"] if f["name"] == "fo")["recent"][-1]["target"] == "plain"
    sent = backend.bodies[-1]
    assert sent.get("stop") == ["END", "\n\n"]  # on the old code: no stop at all
    assert sent["tool_choice"] == "required" and sent["tools"] == TOOLS
