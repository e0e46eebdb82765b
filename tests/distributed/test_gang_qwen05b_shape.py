"""The issue's own proof at full width: a model with Qwen2.5-0.5B's layer
shapes (896 wide, 24 layers, 14 heads over 2 KV heads, factory weights),
split over two ranks by ring on loopback, answers byte for byte what the
same model answers in one process, streamed and not, through the openai
client. The rest of the gang's suite runs the tiny model
(tests/distributed/test_gang_e2e.py)."""

from __future__ import annotations

import openai
import pytest
from support.daemon import daemon_in_thread

from mlxd.factory import ModelRecipe, build_model

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

CHAT = [{"role": "user", "content": "Read the configuration file and report the errors"}]


def test_a_qwen_05b_shaped_model_over_two_ranks_answers_as_one_process(tmp_path):
    import yaml

    path = build_model(ModelRecipe("qwen2", "bench"))
    registry = tmp_path / "models.yaml"
    registry.write_text(yaml.safe_dump({
        "manager": {"memory_budget": "12GB", "cache_dir": str(tmp_path / "cache")},
        "models": [
            {"name": "solo", "path": str(path), "max_context": 2048},
            {"name": "gang", "path": str(path), "max_context": 2048,
             "parallel": {"mode": "tensor", "ranks": 2, "transport": "ring", "step_timeout_s": 30}},
        ],
    }))
    with daemon_in_thread(registry, tmp_path) as daemon:
        client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0, timeout=300)
        ask = dict(messages=CHAT, max_tokens=16, temperature=0)
        solo = client.chat.completions.create(model="solo", **ask).choices[0].message.content
        assert solo
        reply = client.chat.completions.create(model="gang", **ask)
        assert reply.choices[0].message.content == solo
        stream = client.chat.completions.create(model="gang", stream=True, **ask)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == solo
        ranks = daemon.model("gang")["ranks"]
        assert [r["state"] for r in ranks] == ["ready", "ready"]
