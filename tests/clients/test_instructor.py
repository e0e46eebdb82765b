"""instructor over the OpenAI client: Mode.TOOLS and Mode.JSON_SCHEMA give a
validated response_model."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_instructor_modes_validate_against_the_demo(demo):
    got = drive("instructor", "instructor_modes.py", demo.url)
    for mode in ("TOOLS", "JSON_SCHEMA"):
        assert got[mode]["level"] in ("low", "high") and isinstance(got[mode]["ok"], bool), got
    assert got["plain"].strip()
