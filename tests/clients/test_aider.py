"""aider with one --message (--yes --no-git): it gets an answer and writes it
to its chat history, with no error from the API."""

from __future__ import annotations

import pytest
from clients.clients_support import drive

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_aider_answers_a_message_against_the_demo(demo):
    got = drive("aider", "aider_cli.py", demo.url, LITELLM_LOCAL_MODEL_COST_MAP="True")
    assert got["rc"] == 0, got
    assert got["reply"], got
    # aider names an API failure by litellm's exception (litellm.BadRequestError ...);
    # its failed fetch of model metadata from GitHub (offline) is not one.
    assert "litellm." not in got["stdout"] + got["stderr"], got
