"""Tool calling and structured output on /v1/chat/completions, end to end:
a real daemon, real tiny models (random weights), the official openai client.

A random-weight model never writes a well-formed call or JSON by itself:
every call and every JSON answer that validates here was forced by the
grammar, or parsed out of what the model wrote.
"""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from support.daemon import daemon_in_thread, tiny_model, wait_until, write_registry
from tools.tool_models import with_template

pytestmark = pytest.mark.mlx

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "exact": {"type": "boolean"}},
    "required": ["a", "exact"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add numbers", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what is two plus two?"}]
# Nested objects, arrays, enums and required fields; closed and bounded so
# that even a random model finishes well inside max_tokens.
REPORT = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 12},
        "severity": {"enum": ["low", "medium", "high"]},
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}, "team": {"enum": ["core", "api"]}},
            "required": ["name", "team"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"enum": ["bug", "docs", "perf"]}, "minItems": 1, "maxItems": 3},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["title", "severity", "owner", "tags", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai-tools")
    tooly = with_template(tiny_model("qwen"), tmp / "qwen-tools")
    registry = write_registry(
        tmp,
        [
            # Tool calling off.
            {"name": "plain", "model": "qwen", "tool_parser": "none"},
            # The factory's plain ChatML template: no tool-call format, no place for tools.
            {"name": "untooled", "model": "qwen"},
            # A Qwen 2.5-style template: json_tools, batched.
            {"name": "tooly", "path": str(tooly), "max_concurrency": 4},
            {"name": "solo", "path": str(tooly), "max_concurrency": 1},
        ],
    )
    with daemon_in_thread(registry, tmp) as d:
        d.tooly_path = tooly
        yield d


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


def assert_valid_calls(message, only: str | None = None):
    assert message.tool_calls, "no call was made"
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in SCHEMAS
        if only:
            assert call.function.name == only
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_required_tool_choice_returns_a_call_that_validates(client, model):
    reply = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=1.0, seed=3
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_valid_calls(choice.message)
    assert len(choice.message.tool_calls) == 1  # parallel_tool_calls not asked for
    assert choice.message.content is None  # nothing before the call, no markup
    assert reply.usage.completion_tokens > 5


def test_a_named_function_is_the_one_called(client):
    for seed in range(3):
        reply = client.chat.completions.create(
            model="tooly", messages=ASK, tools=TOOLS, max_tokens=120, temperature=1.0, seed=seed,
            tool_choice={"type": "function", "function": {"name": "add"}},
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        assert_valid_calls(reply.choices[0].message, only="add")


def test_parallel_tool_calls_allow_several_valid_calls_with_distinct_ids(client):
    counts = set()
    for seed in range(4):
        reply = client.chat.completions.create(
            model="tooly", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=True,
            max_tokens=300, temperature=1.0, seed=seed,
        )
        message = reply.choices[0].message
        assert_valid_calls(message)
        assert 1 <= len(message.tool_calls) <= 4
        assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)
        counts.add(len(message.tool_calls))
    assert counts, "every answer held between one and four calls"


def test_auto_gives_a_valid_answer_either_way(client):
    for seed in range(3):
        reply = client.chat.completions.create(
            model="tooly", messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=24, temperature=1.0, seed=seed
        )
        choice = reply.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert_valid_calls(choice.message)
        else:
            assert choice.finish_reason in ("stop", "length")
            assert "<tool_call>" not in (choice.message.content or "")


def _rendered(daemon, messages, tools=None) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(daemon.tooly_path))
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def _token_count(daemon, text: str) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(daemon.tooly_path))
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_a_conversation_with_tool_results_renders_through_the_template(client, daemon):
    first = client.chat.completions.create(
        model="tooly", messages=ASK, tools=TOOLS, max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ]
    second = client.chat.completions.create(model="tooly", messages=history, tools=TOOLS, max_tokens=4)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # What the template makes of the same turns, the call and its result included:
    arguments = json.loads(call.function.arguments)
    text = _rendered(daemon, [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"},
    ], TOOLS)
    assert "<tool_response>\nSunny, 21 C\n</tool_response>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(arguments) in text
    # ... is exactly the prompt the model got: every token of it.
    assert second.usage.prompt_tokens == _token_count(daemon, text)
    without_turns = _token_count(daemon, _rendered(daemon, ASK, TOOLS))
    assert second.usage.prompt_tokens > without_turns + 20


def test_tool_choice_none_hides_the_tools(client, daemon):
    reply = client.chat.completions.create(model="tooly", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert not reply.choices[0].message.tool_calls
    assert reply.usage.prompt_tokens == _token_count(daemon, _rendered(daemon, ASK))
    with_tools = client.chat.completions.create(model="tooly", messages=ASK, tools=TOOLS, max_tokens=1)
    assert with_tools.usage.prompt_tokens == _token_count(daemon, _rendered(daemon, ASK, TOOLS))


def _reassembled(chunks) -> tuple[dict[int, dict[str, str]], str, list[str]]:
    calls: dict[int, dict[str, str]] = {}
    content = ""
    finishes = []
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": "", "ids": 0, "names": 0})
            if delta.id:
                call["id"] = delta.id
                call["ids"] += 1
            if delta.function and delta.function.name:
                call["name"] = delta.function.name
                call["names"] += 1
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return calls, content, finishes


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_streamed_tool_call_deltas_reassemble_to_the_non_streamed_call(client, model):
    kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(**kw, stream=True))
    calls, content, finishes = _reassembled(chunks)
    assert list(calls) == [0]
    call = calls[0]
    # The id and the name come once, in the first delta of the call.
    assert call["ids"] == 1 and call["names"] == 1 and call["id"].startswith("call_")
    assert (call["name"], call["arguments"]) == (whole.function.name, whole.function.arguments)
    assert content == ""  # no call markup leaked into content
    assert finishes == ["tool_calls"]


def _snapshot_message(message) -> tuple:
    calls = [(c.type, c.function.name, c.function.arguments) for c in message.tool_calls or ()]
    return message.role, message.content, calls


@pytest.mark.parametrize("tool_choice", ["required", "auto", "none"])
def test_the_sdk_stream_accumulator_gives_the_unstreamed_message(client, tool_choice):
    # A call's content is null in the whole answer; the stream opened with
    # content "", so the SDK's accumulated message said "" where it said None.
    kw = dict(model="tooly", messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=60, temperature=0)
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        streamed = stream.current_completion_snapshot.choices[0]
    assert _snapshot_message(streamed.message) == _snapshot_message(whole.message)
    assert streamed.finish_reason == whole.finish_reason
    if tool_choice == "required":
        assert whole.message.content is None and whole.message.tool_calls


def test_a_stream_cut_inside_a_call_ends_cleanly(daemon):
    body = {"model": "tooly", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 6,
            "stream": True}
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            raw = "".join(response.iter_text())
    frames = [f[len("data: "):] for f in raw.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The half-written call is neither a call nor text.
    assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == ""
    assert "<tool_call>" not in raw


def test_a_stop_string_does_not_cut_a_forced_call(client):
    reply = client.chat.completions.create(
        model="tooly", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, stop=['"', "{"]
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert_valid_calls(reply.choices[0].message)


# --- structured output --------------------------------------------------------


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_json_schema_output_validates_nested_objects_arrays_enums_and_required(client, model):
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model, messages=ASK, max_tokens=200, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT, "strict": True}},
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), REPORT)


def test_json_object_output_is_a_json_object(client):
    reply = client.chat.completions.create(
        model="tooly", messages=ASK, max_tokens=40, temperature=0, response_format={"type": "json_object"}
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        # Free keys and strings may run on: cut, and said so.
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_constrained_output_cut_by_max_tokens_says_length(client):
    reply = client.chat.completions.create(
        model="tooly", messages=ASK, max_tokens=5, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "report", "schema": REPORT}},
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.content)


def test_a_constrained_and_a_free_request_share_one_batch(client, daemon):
    free_kw = dict(model="tooly", messages=ASK, max_tokens=150, temperature=0, extra_body={"ignore_eos": True})
    schema = {"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                         "minItems": 15, "maxItems": 15}},
              "required": ["words"], "additionalProperties": False}
    results: dict[str, object] = {}
    seen = []

    def constrained():
        results["constrained"] = client.chat.completions.create(
            model="tooly", messages=ASK, max_tokens=300, temperature=1.0, seed=5,
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        )

    def free():
        results["free"] = client.chat.completions.create(**free_kw)

    threads = [threading.Thread(target=constrained), threading.Thread(target=free)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        # The model may still be loading (this test run alone): no engine figures yet.
        seen.append((daemon.model("tooly").get("engine") or {}).get("batch_size", 0))
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert max(seen) == 2, f"the two requests decoded in one batch (batch sizes seen: {sorted(set(seen))})"
    structured = results["constrained"].choices[0]
    assert structured.finish_reason == "stop"
    jsonschema.validate(json.loads(structured.message.content), schema)
    plain = results["free"].choices[0]
    assert plain.finish_reason == "length" and results["free"].usage.completion_tokens == 150
    # The other row's grammar never reached this one. (Not compared with the
    # answer alone: a row's greedy tokens may differ with the batch's size.)
    assert not plain.message.content.startswith("{"), plain.message.content


# --- errors ---------------------------------------------------------------------

BAD = [
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools[0]", "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0]", "parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs `tools`"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/gone"}}}},
        "response_format",
        "/$defs/gone",
    ),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "response_format",
        "cannot be combined",
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra,param,words", BAD)
def test_bad_tools_tool_choice_and_response_format_are_openai_400s(daemon, extra, param, words, stream):
    body = {"model": "tooly", "messages": ASK, "max_tokens": 4, "stream": stream, **extra}
    response = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]


def test_a_body_of_the_wrong_shape_is_a_400_naming_the_field(daemon):
    body = {"model": "tooly", "messages": ASK, "tools": {"type": "function"}}
    response = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools"


def test_tools_on_a_model_with_tool_calling_off_name_the_registry_key(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="plain", messages=ASK, tools=TOOLS, max_tokens=4)
    assert caught.value.body["param"] == "tools"
    assert "tool_parser" in caught.value.body["message"]
    # Without tools, or with tool_choice none, the same model answers.
    reply = client.chat.completions.create(model="plain", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=2)
    assert reply.choices[0].message.content


# --- tool results pair with the calls before them ------------------------------------


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome", "days": 1}'}}
CALLED = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "Rain, 14 C"}
ORPHAN = "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"
UNANSWERED = "The following tool_call_ids did not have response messages: "


@pytest.mark.parametrize(("messages", "param", "words"), [
    ([*ASK, RESULT], "messages.[1].role", ORPHAN),  # no call before it at all
    ([*CALLED, {**RESULT, "tool_call_id": "call_9"}], "messages.[2].role", ORPHAN),  # a call nobody made
    ([*CALLED, RESULT, {"role": "user", "content": "And?"}, RESULT], "messages.[4].role", ORPHAN),  # the turn moved on
    ([*CALLED, {"role": "user", "content": "Never mind"}], "messages.[1].role", UNANSWERED + "call_1"),
    (CALLED, "messages.[1].role", UNANSWERED + "call_1"),  # the conversation ends on the calls
    ([*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "call_2"}]}, RESULT],
     "messages.[1].role", UNANSWERED + "call_2"),
])
def test_tool_results_and_calls_that_do_not_pair_are_refused_as_openai_refuses_them(client, messages, param, words):
    # A result of no call reached the template as the answer to nothing, and a
    # call with no result as a call the model then waited on: nonsense either way.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tooly", messages=messages, tools=TOOLS, max_tokens=2)
    error = caught.value.body
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert words in error["message"]


def test_parallel_calls_answered_in_any_order_are_taken(client):
    second = {**CALL, "id": "call_2"}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL, second]},
                {**RESULT, "tool_call_id": "call_2"}, RESULT, {"role": "user", "content": "And tomorrow?"}]
    reply = client.chat.completions.create(model="tooly", messages=messages, tools=TOOLS, max_tokens=1)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")


# --- n, frequency_penalty ---------------------------------------------------------


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_n_choices_differ_by_seed_and_count_the_prompt_once(client, daemon, model):
    one = client.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=1.0, seed=7)
    steps = daemon.model(model)["engine"]["batched_steps"]
    three = client.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=1.0, seed=7, n=3)
    if model == "tooly":  # the batched engine decodes the three side by side
        assert daemon.model(model)["engine"]["batched_steps"] - steps < 2 * 12
    assert [c.index for c in three.choices] == [0, 1, 2]
    texts = [c.message.content for c in three.choices]
    assert texts[0] == one.choices[0].message.content  # choice 0 is the request as asked
    assert len(set(texts)) == 3
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert three.usage.completion_tokens == 36


def test_n_choices_hold_n_slots_and_more_than_max_concurrency_is_a_400(client, daemon):
    """#24 item 10: n choices decode side by side, each with its own KV, so
    they take n of the model's max_concurrency slots for as long as they run."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tooly", messages=ASK, max_tokens=2, n=5)
    error = caught.value.body
    assert error["param"] == "n" and error["type"] == "invalid_request_error"
    assert "max_concurrency: 4" in error["message"] and "at most 4" in error["message"]
    assert daemon.model("tooly")["active_leases"] == 0

    body = {"model": "tooly", "messages": ASK, "max_tokens": 3000, "ignore_eos": True, "n": 3, "stream": True}
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=60) as wide:
        lines = wide.iter_lines()
        while '"delta"' not in next(lines):  # (the stream may open before the lease)
            pass
        assert daemon.model("tooly")["active_leases"] == 3
        pair = {"model": "tooly", "messages": ASK, "max_tokens": 1, "n": 2}
        waiting = threading.Thread(
            target=lambda: httpx.post(f"{daemon.url}/v1/chat/completions", json=pair, timeout=60), daemon=True
        )
        waiting.start()
        wait_until(lambda: daemon.model("tooly")["queued"] == 1, timeout=10)  # 3 + 2 > 4: it waits its turn
        assert daemon.model("tooly")["active_leases"] == 3
    waiting.join(30)
    assert not waiting.is_alive()
    wait_until(lambda: daemon.model("tooly")["active_leases"] == 0, timeout=10)


def test_n_choices_stream_by_index_and_each_forced_call_validates(client):
    chunks = list(client.chat.completions.create(
        model="tooly", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120, temperature=1.0,
        seed=2, n=2, stream=True,
    ))
    by_choice: dict[int, list] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            by_choice.setdefault(choice.index, []).append(chunk.model_copy(update={"choices": [choice]}))
    assert sorted(by_choice) == [0, 1]
    for index, own in by_choice.items():
        calls, content, finishes = _reassembled(own)
        assert finishes == ["tool_calls"] and content == ""
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[calls[0]["name"]])


def test_frequency_penalty_reaches_the_sampler(client):
    from collections import Counter

    kw = dict(model="tooly", messages=ASK, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    free = client.chat.completions.create(**kw).choices[0].message.content
    # A negative penalty rewards tokens already written: the answer repeats itself.
    looping = client.chat.completions.create(**kw, frequency_penalty=-2.0).choices[0].message.content
    assert looping != free
    assert max(Counter(looping).values()) > max(Counter(free).values())


def test_what_stays_refused_is_a_clear_400(daemon):
    cases = [
        ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
        ("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs"),
        ("/v1/chat/completions", {"messages": ASK, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": ASK, "logprobs": True, "tools": TOOLS}, "logprobs"),
        # A structured answer ends where its grammar does; ignore_eos would
        # run on past it, unconstrained (valid JSON, then anything).
        ("/v1/chat/completions", {"messages": ASK, "ignore_eos": True, "response_format": {"type": "json_object"}},
         "ignore_eos"),
        ("/v1/chat/completions", {"messages": ASK, "ignore_eos": True, "tools": TOOLS, "tool_choice": "required"},
         "ignore_eos"),
        ("/v1/completions", {"prompt": "x", "ignore_eos": True, "response_format": {"type": "json_object"}},
         "ignore_eos"),
    ]
    for path, extra, param in cases:
        response = httpx.post(f"{daemon.url}{path}", json={"model": "tooly", "max_tokens": 2, **extra}, timeout=60)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


# --- logprobs ---------------------------------------------------------------------


def _logprobs(client, model, **kw):
    reply = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=8, logprobs=True, top_logprobs=3, **kw
    )
    return reply, reply.choices[0].logprobs.content


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_logprobs_come_per_token_with_their_alternatives(client, model):
    reply, entries = _logprobs(client, model, temperature=0)
    assert len(entries) == reply.usage.completion_tokens == 8
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        # Greedy: the chosen token is the most likely one.
        assert entry.token == entry.top_logprobs[0].token and entry.logprob == pytest.approx(values[0])
        assert entry.bytes == list(entry.token.encode())
    # The tokens spell the answer (the tiny model writes ASCII here; the
    # detokenizer drops the space a first token may start with).
    assert "".join(e.token for e in entries).lstrip() == reply.choices[0].message.content.lstrip()
    streamed = []
    for chunk in client.chat.completions.create(
        model=model, messages=ASK, max_tokens=8, logprobs=True, top_logprobs=3, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in entries]


@pytest.mark.parametrize("model", ["tooly", "solo"])
def test_a_token_that_is_part_of_a_character_gives_its_own_bytes(client, daemon, model):
    # Byte-level BPE spells byte 0xE2 (the first of three in "…") as "â"; a
    # token of that byte alone decodes to the replacement character, whose
    # bytes would rebuild a different text. OpenAI gives the byte itself.
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(str(daemon.tooly_path))
    lead = vocab.convert_tokens_to_ids("\u00e2")
    assert lead != vocab.unk_token_id
    reply = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=2, logprobs=True, top_logprobs=2, temperature=0,
        logit_bias={str(lead): 100}, extra_body={"ignore_eos": True},
    )
    entries = reply.choices[0].logprobs.content
    assert [(e.token, e.bytes) for e in entries] == [("bytes:\\xe2", [0xE2])] * 2
    assert (entries[0].top_logprobs[0].token, entries[0].top_logprobs[0].bytes) == ("bytes:\\xe2", [0xE2])


def test_logprobs_are_the_same_on_the_single_and_the_batched_path(client):
    _, single = _logprobs(client, "solo", temperature=0)
    _, batched = _logprobs(client, "tooly", temperature=0)
    assert [e.token for e in single] == [e.token for e in batched]
    assert [e.logprob for e in single] == pytest.approx([e.logprob for e in batched], abs=1e-3)


def test_logprobs_under_a_grammar_list_only_allowed_tokens(client):
    reply = client.chat.completions.create(
        model="tooly", messages=ASK, max_tokens=60, temperature=1.0, seed=4, logprobs=True, top_logprobs=5,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": REPORT}},
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    # The first token opens the object: nothing else was allowed, so it is certain.
    assert entries[0].token.startswith("{") and entries[0].logprob == pytest.approx(0.0, abs=1e-4)
    assert all(math.isfinite(t.logprob) for e in entries for t in e.top_logprobs)
