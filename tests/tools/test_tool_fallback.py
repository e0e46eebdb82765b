"""Tools on a model whose chat template has no place for them (the factory's
plain ChatML, as SmolLM2's): mlxd writes them into the prompt in the
json_tools convention and reads the calls back with that parser."""

from __future__ import annotations

import json

import pytest
from engine.engine_support import collect, greedy, run, text_of
from mlx_lm.utils import load_tokenizer

from mlxd.engine.prompt import chat_tokens
from mlxd.tools import fallback, formats
from mlxd.api.openai.bodies import chat_tools
from mlxd.tools.forcing import forced_call
from mlxd.tools.splitter import split_answer

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}}]
HISTORY = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 1}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "3 C"},
]


@pytest.fixture(scope="module")
def tokenizer(qwen_tiny):
    return load_tokenizer(qwen_tiny)


def test_the_plain_template_renders_no_tools_so_mlxd_writes_them(tokenizer, hermes_tiny):
    assert not fallback.renders_tools(tokenizer.chat_template)
    assert fallback.renders_tools(load_tokenizer(hermes_tiny).chat_template)
    prompt = tokenizer.decode(chat_tokens(tokenizer, HISTORY, TOOLS))
    # The tool list in the system turn, after the client's own system prompt.
    system = prompt.split("<|im_end|>")[0]
    assert "Be terse." in system and "<tools>" in system
    assert json.dumps(TOOLS[0]) in system
    # The earlier calls in their assistant turn, the two results in one user turn.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' in prompt
    assert prompt.count("<tool_response>") == 2
    assert "<|im_start|>tool" not in prompt
    user_turns = prompt.split("<|im_start|>user")
    assert "21 C" in user_turns[-1] and "3 C" in user_turns[-1]


def test_without_tools_or_tool_turns_the_prompt_is_the_templates_own(tokenizer):
    plain = [{"role": "user", "content": "Hi"}]
    assert chat_tokens(tokenizer, plain) == list(tokenizer.apply_chat_template(plain, add_generation_prompt=True))


def test_a_forced_call_on_the_plain_model_parses_with_the_default_format(single):
    fmt = single.tool_format
    assert fmt.name == formats.DEFAULT
    constraint = forced_call(fmt, chat_tools(TOOLS), "get_weather")
    asked = [{"role": "user", "content": "Weather in Oslo?"}]
    chunks = run(collect(single, greedy(messages=asked, tools=TOOLS, max_tokens=60, constraint=constraint)))
    (call,) = split_answer(fmt, text_of(chunks), TOOLS).tool_calls
    assert call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert arguments["city"] in ("Paris", "Oslo") and 1 <= arguments["days"] <= 7


def test_a_template_that_trips_on_a_value_s_shape_is_the_clients_400(qwen_tiny):
    # Qwen3.5's template walks a call's arguments with `items`; any value of
    # a shape such a filter does not take raised a TypeError past the
    # template's own errors, a 500 for what the client sent.
    from mlxd.errors import BadRequest

    strict = load_tokenizer(qwen_tiny)
    strict.chat_template = "{% for m in messages %}{% for k, v in m.content|items %}{{ k }}{% endfor %}{% endfor %}"
    with pytest.raises(BadRequest, match="The chat template cannot render these messages: TypeError"):
        chat_tokens(strict, [{"role": "user", "content": "a string, not a mapping"}])
