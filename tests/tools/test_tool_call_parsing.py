"""Tool calls out of recorded model outputs, per family, whole and streamed.

The outputs are what each family's models write (from their chat templates
and model cards). Streaming is tested two ways: every split of the output
into two deltas, and the deltas an engine really streams, one token at a
time through mlx-lm's detokenizer, which splits the markers across tokens.
"""

from __future__ import annotations

import itertools
import json

import pytest

from mlxd.tools.formats import format_named
from mlxd.tools.splitter import (
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallSplitter,
    ToolCallStart,
    finish_reason,
    split_answer,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}},
]

# (format, template hint, output, expected content, expected [(name, arguments)])
RECORDED = {
    "qwen2.5 two calls after text": (
        "json_tools", "",
        "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>",
        "I'll check both.\n\n",
        [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})],
    ),
    "hermes call only": (
        "json_tools", "",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "",
        [("get_time", {})],
    ),
    "qwen3-coder xml": (
        "qwen3_coder", "",
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>",
        "Checking.\n",
        [("get_weather", {"city": "São Paulo", "days": 3, "metric": True})],
    ),
    "llama 3.1 json": (
        "llama3_json", "",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    "llama 3.2 two calls": (
        "llama3_json", "",
        "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}",
        "",
        [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "UTC"})],
    ),
    "llama python_tag": (
        "llama3_json", "",
        "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"zone\": \"PST\"}}",
        "",
        [("get_time", {"zone": "PST"})],
    ),
    "llama plain answer": (
        "llama3_json", "",
        "The weather in Paris is sunny.",
        "The weather in Paris is sunny.",
        [],
    ),
    "mistral v0.3 json list": (
        "mistral", "",
        "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}, \"id\": \"a1b2c3d4e\"}]",
        "",
        [("get_weather", {"city": "Lyon"})],
    ),
    "mistral [ARGS] two calls": (
        "mistral", "[ARGS]",
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]get_time[ARGS]{\"zone\": \"CET\"}",
        "",
        [("get_weather", {"city": "Rome"}), ("get_time", {"zone": "CET"})],
    ),
    "text with angle brackets": (
        "json_tools", "",
        "Use a <b> tag when x < y, not <tool>.",
        "Use a <b> tag when x < y, not <tool>.",
        [],
    ),
}


def calls_of(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def stream(fmt, deltas, tools=TOOLS):
    splitter = ToolCallSplitter(fmt, tools, new_id=iter(f"call_{i}" for i in itertools.count()).__next__)
    events = []
    for delta in deltas:
        events += splitter.feed(delta)
    events += splitter.finish()
    return events, splitter


def reassemble(events):
    """What an OpenAI streaming client builds from the deltas."""
    content, calls = "", {}
    for event in events:
        if isinstance(event, TextDelta):
            content += event.text
        elif isinstance(event, ToolCallStart):
            assert event.index not in calls, "id and name come once per call"
            calls[event.index] = [event.name, ""]
        elif isinstance(event, ToolCallArguments):
            calls[event.index][1] += event.fragment
    return content, [(name, json.loads(args)) for name, args in calls.values()]


@pytest.mark.parametrize("case", RECORDED, ids=list(RECORDED))
def test_whole_answer(case):
    name, hint, output, content, expected = RECORDED[case]
    answer = split_answer(format_named(name, hint), output, TOOLS)
    assert answer.content == content
    assert calls_of(answer.tool_calls) == expected
    assert answer.dropped == 0
    assert all(c.id for c in answer.tool_calls)


@pytest.mark.parametrize("case", RECORDED, ids=list(RECORDED))
def test_every_split_into_two_deltas_gives_the_same(case):
    name, hint, output, content, expected = RECORDED[case]
    fmt = format_named(name, hint)
    for cut in range(len(output) + 1):
        events, _ = stream(fmt, [output[:cut], output[cut:]])
        assert reassemble(events) == (content, expected), cut


@pytest.fixture(scope="module")
def tokenizer(qwen_tiny):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(qwen_tiny)


@pytest.mark.parametrize("case", RECORDED, ids=list(RECORDED))
def test_token_by_token_as_the_engine_streams(case, tokenizer):
    name, hint, output, content, expected = RECORDED[case]
    detokenizer = tokenizer.detokenizer
    deltas = []
    for token in tokenizer.encode(output, add_special_tokens=False):
        detokenizer.add_token(token)
        deltas.append(detokenizer.last_segment)
    detokenizer.finalize()
    deltas.append(detokenizer.last_segment)
    assert "".join(deltas) == output
    assert max(len(d) for d in deltas) < len(format_named(name, hint).start or "{\"name\"")  # markers span tokens
    events, _ = stream(format_named(name, hint), deltas)
    assert reassemble(events) == (content, expected)


def test_the_delta_shape_is_start_arguments_end_per_call():
    name, hint, output, _, _ = RECORDED["qwen2.5 two calls after text"]
    events, _ = stream(format_named(name, hint), list(output))
    kinds = [type(e).__name__ for e in events if not isinstance(e, TextDelta)]
    assert kinds == ["ToolCallStart", "ToolCallArguments", "ToolCallEnd"] * 2
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.id, s.name) for s in starts] == [(0, "call_0", "get_weather"), (1, "call_1", "get_time")]
    assert [e.index for e in events if isinstance(e, ToolCallEnd)] == [0, 1]


def test_the_models_own_call_id_is_kept():
    name, hint, output, _, _ = RECORDED["mistral v0.3 json list"]
    assert split_answer(format_named(name, hint), output).tool_calls[0].id == "a1b2c3d4e"


@pytest.mark.parametrize(
    ("name", "output", "content"),
    [
        ("json_tools", "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"argu", "Let me look."),
        ("json_tools", "Let me look.<tool_ca", "Let me look.<tool_ca"),
        ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", ""),
        ("llama3_json", "{\"name\": \"get_weather\", \"parameters\": {\"ci", ""),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Ro", ""),
    ],
)
def test_a_stream_that_ends_mid_call_ends_cleanly(name, output, content):
    for deltas in ([output], list(output)):
        events, splitter = stream(format_named(name), deltas)
        text, calls = reassemble(events)
        assert text == content  # no call markup in the text
        assert calls == []
    # A cut call is counted, a cut marker is only text.
    assert splitter.dropped == (0 if output.endswith("<tool_ca") else 1)


def test_a_closed_call_that_does_not_parse_is_dropped_not_shown():
    output = "Hi.<tool_call>\nnot json at all\n</tool_call> Bye."
    answer = split_answer(format_named("json_tools"), output)
    assert answer.content == "Hi. Bye."
    assert answer.tool_calls == [] and answer.dropped == 1


def test_finish_reason_is_tool_calls_only_when_an_answer_that_made_calls_stopped():
    calls = split_answer(format_named("json_tools"), RECORDED["hermes call only"][2]).tool_calls
    assert finish_reason("stop", calls) == "tool_calls"
    assert finish_reason("length", calls) == "length"
    assert finish_reason("stop", []) == "stop"


def test_openai_shape():
    call = split_answer(format_named("json_tools"), RECORDED["hermes call only"][2]).tool_calls[0]
    shape = call.as_openai()
    assert shape["type"] == "function" and shape["function"] == {"name": "get_time", "arguments": "{}"}
    assert shape["id"].startswith("call_")


def test_a_number_past_a_double_comes_back_as_json_a_client_parses():
    # A grammar-forced random model wrote this for pi's `read` tool; the
    # arguments went out as `"limit": Infinity`, which JSON.parse refuses.
    output = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "", "days": 1e999, "metric": -1e999}}\n</tool_call>'
    arguments = split_answer(format_named("json_tools", ""), output, TOOLS).tool_calls[0].arguments
    parsed = json.loads(arguments, parse_constant=lambda name: pytest.fail(f"{name} in {arguments}"))
    assert parsed == {"city": "", "days": 1.7976931348623157e308, "metric": -1.7976931348623157e308}
