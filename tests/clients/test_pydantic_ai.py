"""pydantic-ai with OpenAIProvider(base_url=...): the chat model and the
Responses model, a plain answer and a typed output_type each."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_pydantic_ai_models_run_against_the_demo(demo):
    got = drive("pydantic-ai", "pydantic_ai_models.py", demo.url)
    for kind in ("chat", "responses"):
        assert got[f"{kind}_plain"].strip()
        typed = got[f"{kind}_typed"]
        assert typed["level"] in ("low", "high") and isinstance(typed["ok"], bool), got
