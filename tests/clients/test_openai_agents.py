"""The OpenAI Agents SDK (Responses model): a plain answer, streamed and
whole; an answer cut by max_tokens, which it must not take for a whole one;
a function tool called with parsed arguments, alone and in a namespace; a
typed output."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_agents_sdk_runs_against_the_demo(demo):
    got = drive("openai-agents", "openai_agents.py", demo.url)
    assert "hello" in got["plain"].lower() and got["streamed"] == got["plain"]
    # A cut answer ends in response.incomplete: the SDK raises, streamed as whole.
    for way in ("cut_stream", "cut_whole"):
        assert "response.incomplete" in got[way].get("raised", "") or "incomplete" in got[way].get("raised", ""), got
    # The SDK parsed the forced call's arguments and ran the tool with them.
    assert got["tool"]["city"] in ("Paris", "Oslo") and 1 <= got["tool"]["days"] <= 7
    # The same from a namespace (tool_namespace): the SDK found the call's tool by namespace and name.
    assert got["namespaced"]["city"] in ("Paris", "Oslo") and 1 <= got["namespaced"]["days"] <= 7
    assert got["typed"]["level"] in ("low", "high") and isinstance(got["typed"]["ok"], bool)
