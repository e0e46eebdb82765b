"""Forced tool calls for schemas with ``$defs`` / ``$ref``, the shape Pydantic
(and so most Python tool frameworks and MCP servers) gives any nested model:
every forceable family writes a call that Pydantic itself validates, and two
tools whose ``$defs`` share a name each keep their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of
from tools.tool_models import pydantic_tools

from mlxd.engine.types import SamplingParams
from mlxd.api.openai.bodies import chat_tools
from mlxd.tools.forcing import forced_call
from mlxd.tools.splitter import split_answer

pytestmark = pytest.mark.mlx

TOOLS, MODELS = pydantic_tools()
ASK = [{"role": "user", "content": "Send a tea to Paris, then refund order 7."}]
FAMILIES = ["json_tools", "qwen3_coder", "mistral", "llama3_json"]


@pytest.fixture(scope="module")
def engines(worker, hermes_tiny: Path, qwen_tiny: Path):
    from mlxd.engine.loader import load_text_engine

    loaded = {"json_tools": run(load_text_engine(spec_for(hermes_tiny, "json_tools"), worker))}
    for family in FAMILIES[1:]:
        loaded[family] = run(load_text_engine(spec_for(qwen_tiny, family, tool_parser=family), worker))
    yield loaded
    for engine in loaded.values():
        run(engine.close())


def _calls(engine, name: str | None, seed: int):
    constraint = forced_call(engine.tool_format, chat_tools(TOOLS), name)
    sampling = SamplingParams(temperature=1.0, seed=seed)
    chunks = run(collect(engine, greedy(messages=ASK, tools=TOOLS, max_tokens=160, constraint=constraint, sampling=sampling)))
    return split_answer(engine.tool_format, text_of(chunks), TOOLS).tool_calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["place_order", "refund"])
def test_a_forced_call_with_refs_validates_with_pydantic(engines, family, name):
    engine = engines[family]
    assert engine.tool_format.name == family
    for seed in range(2):
        (call,) = _calls(engine, name, seed)
        assert call.name == name
        MODELS[name].model_validate(json.loads(call.arguments))


@pytest.mark.parametrize("family", FAMILIES)
def test_required_over_two_tools_whose_defs_share_a_name(engines, family):
    for seed in range(3):
        calls = _calls(engines[family], None, seed)
        assert calls
        for call in calls:
            MODELS[call.name].model_validate(json.loads(call.arguments))
