"""Every text family of the zoo through every request path of mlxd, against
plain mlx-lm: single and batched, streaming, stop strings, tools with the
family's own parser, forced calls, json_schema. One daemon serves them all.

Greedy output must be exactly what ``mlx_lm.generate`` writes for the same
messages through the family's own template. A path the family cannot take
(see the row's ``unsupported`` in mlxd/factory/zoo.py) must be refused with
a clear 400 that says why, not a wrong answer.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from agents.agents_support import WEATHER
from zoo.zoo_support import CHAT, answer_text, batch_name, chat, family

pytestmark = pytest.mark.mlx

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}}]
# (docs/thinking.md) ends a reasoning the prompt opened, for the grammar's answer after it.
BUDGET = {"max_tokens": 4}
# A free string and an optional flag: the forms a call grammar writes besides enums and integers.
NOTE = {
    "type": "object",
    "properties": {"text": {"type": "string", "maxLength": 12}, "urgent": {"type": "boolean"}},
    "required": ["text"],
}
NOTE_TOOL = {"type": "function", "function": {"name": "note", "description": "Take a note", "parameters": NOTE}}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next two days?"}]
# A turn after a call: the template renders the call and its result its own way.
CALLED = [
    *ASK,
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call0000001", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call0000001", "content": '{"forecast": "sunny", "high": 21}'},
]
# The same conversation as a template receives it from mlx-lm's own server: arguments as a mapping.
CALLED_FOR_TEMPLATE = [
    CALLED[0],
    {**CALLED[1], "tool_calls": [{**CALLED[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    CALLED[2],
]
REPORT = {
    "type": "object",
    "properties": {
        "severity": {"enum": ["low", "medium", "high"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"enum": ["bug", "docs"]}, "minItems": 1, "maxItems": 2},
    },
    "required": ["severity", "count", "tags"],
    "additionalProperties": False,
}
QUESTIONS = [
    CHAT,
    [{"role": "user", "content": "Write a haiku about the sea"}],
    [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": "Explain what a context manager does"}],
]


def middle_word(text: str) -> str:
    """Three plain characters from the second half of ``text`` (whitespace
    and half-decoded bytes make poor stop strings)."""
    for start in range(len(text) // 2, len(text) - 2):
        piece = text[start : start + 3]
        if piece.isprintable() and not any(c.isspace() or c == "\ufffd" for c in piece):
            return piece
    raise AssertionError(f"no stop string to pick in {text!r}")


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def refused(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    return error["message"]


def test_single_greedy_answer_is_mlx_lm_s(zoo_daemon, reference, text_family):
    choice = ok(chat(zoo_daemon, text_family, CHAT))
    assert answer_text(choice["message"]) == reference.answer(text_family, CHAT, 24)


def test_batched_answers_are_each_mlx_lm_s(zoo_daemon, reference, text_family):
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        replies = list(pool.map(lambda m: chat(zoo_daemon, batch_name(text_family), m), QUESTIONS))
    for messages, reply in zip(QUESTIONS, replies, strict=True):
        assert answer_text(ok(reply)["message"]) == reference.answer(text_family, messages, 24)


def test_streamed_deltas_join_to_mlx_lm_s_answer(zoo_daemon, reference, text_family):
    body = {"model": text_family, "messages": CHAT, "temperature": 0, "max_tokens": 24, "stream": True}
    pieces, finish = [], None
    with httpx.stream("POST", f"{zoo_daemon.url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                pieces.append(answer_text(choice.get("delta", {})))
                finish = choice.get("finish_reason") or finish
    assert "".join(pieces) == reference.answer(text_family, CHAT, 24)
    assert finish in ("length", "stop")


def test_a_stop_string_cuts_the_answer_where_mlx_lm_s_text_has_it(zoo_daemon, reference, text_family):
    expected = reference.text(text_family, CHAT, 24)
    stop = middle_word(expected)
    choice = ok(chat(zoo_daemon, text_family, CHAT, stop=[stop]))
    assert answer_text(choice["message"]) == reference.split(text_family, CHAT, expected[: expected.index(stop)])
    assert choice["finish_reason"] == "stop"


def test_tools_render_through_the_family_template_or_are_refused(zoo_daemon, reference, text_family):
    row = family(text_family)
    reply = chat(zoo_daemon, text_family, ASK, tools=TOOLS)
    if "tools" in row.unsupported:
        assert "tool_parser" in refused(reply, "tools")
        return
    choice = ok(reply)
    assert answer_text(choice["message"]) == reference.answer(text_family, ASK, 24, tools=TOOLS)
    # The turn after a call: the call and its result rendered as the family's template does.
    after = ok(chat(zoo_daemon, text_family, CALLED, tools=TOOLS))
    assert answer_text(after["message"]) == reference.answer(text_family, CALLED_FOR_TEMPLATE, 24, tools=TOOLS)


def test_a_forced_call_is_parsed_by_the_family_parser_and_valid(zoo_daemon, text_family):
    row = family(text_family)
    tools = [*TOOLS, NOTE_TOOL]
    schemas = {"get_weather": WEATHER, "note": NOTE}
    # A reasoning budget: a template that opens the think block holds the
    # grammar until the reasoning ends, which a random model never does itself.
    reply = chat(zoo_daemon, text_family, ASK, tools=tools, tool_choice="required", max_tokens=80, reasoning=BUDGET)
    if "forced_tool" in row.unsupported:
        param = "tools" if "tools" in row.unsupported else "tool_choice"
        refused(reply, param)
        return
    named = chat(zoo_daemon, text_family, ASK, tools=tools, tool_choice={"type": "function", "function": {"name": "note"}},
                 max_tokens=80, reasoning=BUDGET)
    for choice, allowed in ((ok(reply), set(schemas)), (ok(named), {"note"})):
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] in allowed
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
        assert choice["finish_reason"] == "tool_calls"


def test_gpt_oss_reasons_in_its_analysis_channel_before_a_forced_call(zoo_daemon, reference):
    # The grammar lets gpt-oss write its analysis message first, as it does
    # unforced (a bias on <|channel|> makes the random model take it); the
    # budget ends the analysis and the call follows, on both paths.
    tokenizer = reference.loaded("gpt_oss")[1]
    bias = {str(tokenizer.convert_tokens_to_ids("<|channel|>")): 100}
    header = len(tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False))
    for model in ("gpt_oss", batch_name("gpt_oss")):
        reply = chat(zoo_daemon, model, ASK, tools=[NOTE_TOOL], tool_choice="required", max_tokens=60,
                     reasoning=BUDGET, logit_bias=bias)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        message = body["choices"][0]["message"]
        assert message["reasoning_content"] and "<|" not in message["reasoning_content"]
        assert not message.get("content")
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "note"
        jsonschema.validate(json.loads(call["function"]["arguments"]), NOTE)
        assert body["choices"][0]["finish_reason"] == "tool_calls"
        # The header, the budget's tokens and the <|end|> it forced.
        reasoning_tokens = body["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert reasoning_tokens == header + BUDGET["max_tokens"] + 1


def test_json_schema_answer_validates(zoo_daemon, text_family):
    response_format = {"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}}
    choice = ok(chat(zoo_daemon, text_family, CHAT, response_format=response_format, max_tokens=60, reasoning=BUDGET))
    jsonschema.validate(json.loads(choice["message"]["content"]), REPORT)
