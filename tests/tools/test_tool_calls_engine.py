"""Tool calling on real tiny models: templates, formats, forced calls.

A random-weight model never writes a well-formed call by itself; every
call that parses and validates here was forced by the grammar.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import jsonschema
import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of

from mlxd.engine.types import SamplingParams
from mlxd.errors import BadRequest
from mlxd.tools import formats
from mlxd.api.openai.bodies import chat_tools
from mlxd.tools.forcing import forced_call
from mlxd.tools.splitter import ToolCallSplitter, finish_reason, split_answer

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "exact": {"type": "boolean"}},
    "required": ["a", "exact"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris and what is two plus two?"}]


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed)


def assert_valid(calls, only: str | None = None):
    assert calls, "no call was made"
    for call in calls:
        assert call.name in SCHEMAS
        if only:
            assert call.name == only
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_the_format_is_inferred_from_the_chat_template(hermes, single):
    assert hermes.tool_format is not None and hermes.tool_format.name == "json_tools"
    # The factory's plain ChatML template names no tool format: mlxd's default.
    assert single.tool_format is not None and single.tool_format.name == formats.DEFAULT
    # Only `tool_parser: none` turns tools off, and the 400 names the key.
    with pytest.raises(BadRequest, match="tool_parser") as info:
        formats.require(None, single.name)
    assert info.value.param == "tools"


def test_tools_and_a_multi_turn_conversation_reach_the_template(hermes):
    conversation = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
    ]
    request = greedy(messages=conversation, tools=TOOLS)
    _, tokenizer = hermes.model.get()
    prompt = tokenizer.decode(hermes.model.prompt_tokens(request))
    assert '"name": "get_weather"' in prompt and '"description": "Add"' in prompt  # the tools, as JSON
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in prompt
    assert "<tool_response>\n{\"temperature\": 21}\n</tool_response>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # Without tools the system turn about them is gone.
    assert "<tools>" not in tokenizer.decode(hermes.model.prompt_tokens(greedy(messages=ASK)))


def test_arguments_that_are_not_json_are_a_bad_request(hermes):
    bad = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]
    with pytest.raises(BadRequest, match="arguments"):
        hermes.model.prompt_tokens(greedy(messages=bad, tools=TOOLS))


@pytest.mark.parametrize("named", [None, "get_weather", "add"])
def test_a_forced_call_validates_against_the_tools_schema(hermes, named):
    constraint = forced_call(hermes.tool_format, chat_tools(TOOLS), named)
    for seed in range(3):
        chunks = run(collect(hermes, greedy(messages=ASK, tools=TOOLS, max_tokens=80, constraint=constraint, sampling=sampled(seed))))
        answer = split_answer(hermes.tool_format, text_of(chunks), TOOLS)
        assert_valid(answer.tool_calls, named)
        assert answer.content == ""
        assert finish_reason(chunks[-1].finish_reason, answer.tool_calls) == "tool_calls"


def test_streamed_deltas_reassemble_to_the_whole_answer(hermes):
    constraint = forced_call(hermes.tool_format, chat_tools(TOOLS), "get_weather")
    chunks = run(collect(hermes, greedy(messages=ASK, tools=TOOLS, max_tokens=80, constraint=constraint, sampling=sampled(4))))
    ids = itertools.count()
    splitter = ToolCallSplitter(hermes.tool_format, TOOLS, new_id=lambda: f"call_{next(ids)}")
    events = [e for c in chunks for e in splitter.feed(c.text)] + splitter.finish()
    whole = split_answer(hermes.tool_format, text_of(chunks), TOOLS, new_id=lambda: "call_0")
    assert splitter.calls == whole.tool_calls
    assert not any(getattr(e, "text", "").count("<tool_call>") for e in events)


def test_without_forcing_the_random_model_writes_no_call(hermes):
    # "auto": the answer is valid either way, and here it is text.
    chunks = run(collect(hermes, greedy(messages=ASK, tools=TOOLS, max_tokens=40, sampling=sampled(0))))
    answer = split_answer(hermes.tool_format, text_of(chunks), TOOLS)
    assert answer.tool_calls == []
    assert "<tool_call>" not in answer.content


def test_a_forced_call_and_a_free_request_share_a_batch(hermes):
    free_alone = text_of(run(collect(hermes, greedy("alone", max_tokens=24))))
    constraint = forced_call(hermes.tool_format, chat_tools(TOOLS), "add")

    async def together():
        return await asyncio.gather(
            collect(hermes, greedy("call", messages=ASK, tools=TOOLS, max_tokens=60, constraint=constraint, sampling=sampled(1))),
            collect(hermes, greedy("free", max_tokens=24)),
        )

    call_chunks, free_chunks = run(together())
    assert_valid(split_answer(hermes.tool_format, text_of(call_chunks), TOOLS).tool_calls, "add")
    assert text_of(free_chunks) == free_alone


@pytest.fixture(scope="module")
def overridden(worker, qwen_tiny: Path, request):
    from mlxd.engine.loader import load_text_engine

    engines = {}
    for name in ("qwen3_coder", "mistral", "llama3_json"):
        engines[name] = run(load_text_engine(spec_for(qwen_tiny, name, tool_parser=name), worker))
    yield engines
    for engine in engines.values():
        run(engine.close())


@pytest.mark.parametrize("family", ["qwen3_coder", "mistral", "llama3_json"])
def test_the_registry_override_picks_the_format_and_forcing_follows_it(overridden, family):
    engine = overridden[family]
    assert engine.tool_format.name == family
    constraint = forced_call(engine.tool_format, chat_tools(TOOLS))
    for seed in range(2):
        chunks = run(collect(engine, greedy(max_tokens=100, constraint=constraint, sampling=sampled(seed))))
        answer = split_answer(engine.tool_format, text_of(chunks), TOOLS)
        assert_valid(answer.tool_calls)


def test_parallel_calls_are_bounded(hermes):
    constraint = forced_call(hermes.tool_format, chat_tools(TOOLS), "add", max_calls=3)
    chunks = run(collect(hermes, greedy(messages=ASK, max_tokens=200, constraint=constraint, sampling=sampled(3))))
    calls = split_answer(hermes.tool_format, text_of(chunks), TOOLS).tool_calls
    assert 1 <= len(calls) <= 3
    assert_valid(calls, "add")


def test_forcing_a_tool_that_is_not_there_is_a_bad_request(hermes):
    with pytest.raises(BadRequest, match="nowhere") as info:
        forced_call(hermes.tool_format, chat_tools(TOOLS), "nowhere")
    assert info.value.param == "tool_choice"


def test_forcing_a_format_without_a_grammar_is_a_bad_request():
    with pytest.raises(BadRequest, match="minimax_m2"):
        forced_call(formats.format_named("minimax_m2"), chat_tools(TOOLS))
