"""The `llm` CLI: models from extra-openai-models.yaml, a streamed answer
(the same as the whole one) and --schema output valid against its schema."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_llm_cli_runs_against_the_demo(demo):
    got = drive("llm", "llm_cli.py", demo.url)
    assert got["streamed"].strip() and got["streamed"] == got["whole"]
    assert set(got["schema"]) == {"ok", "level"}, got
    assert got["schema"]["level"] in ("low", "high") and isinstance(got["schema"]["ok"], bool)
