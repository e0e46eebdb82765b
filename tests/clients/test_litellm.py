"""litellm's `openai/` provider: a plain answer, streamed; a forced tool call
with parsed arguments; a pydantic response_format."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_litellm_runs_against_the_demo(demo):
    # Offline: litellm reads its bundled model list instead of fetching it from GitHub.
    got = drive("litellm", "litellm_sdk.py", demo.url, LITELLM_LOCAL_MODEL_COST_MAP="True")
    assert got["plain"].strip() and got["streamed"] == got["plain"]
    assert got["tool"]["name"] == "get_weather"
    assert got["tool"]["args"]["city"] in ("Paris", "Oslo") and 1 <= got["tool"]["args"]["days"] <= 7
    assert got["typed"]["level"] in ("low", "high") and isinstance(got["typed"]["ok"], bool)
