"""The OpenAI wire form of remote requests: pure translations, no server."""

from __future__ import annotations

import json

import pytest

from mlxd.api.openai.bodies import chat_response_format, chat_tool_choice, chat_tools
from mlxd.engine.types import GenerationRequest, SamplingParams
from mlxd.errors import BackendFailed, UpstreamRejected
from mlxd.remote.answer import MAX_EVENT_BYTES, MAX_TOOL_CALLS, StreamReader, whole_answer
from mlxd.remote.refusals import upstream_error
from mlxd.remote.wire import endpoint, request_body
from mlxd.tools.output_request import OutputRequest


def test_a_chat_request_goes_out_as_a_streaming_chat_completion_under_the_remote_name():
    request = GenerationRequest(
        request_id="r", max_tokens=7, sampling=SamplingParams(temperature=0.2, top_p=0.9, seed=3),
        sampling_set=frozenset({"temperature", "seed"}), stop=["\n\n"], messages=[{"role": "user", "content": "hi"}],
    )
    body = request_body(request, "qwen3.5-122b")
    assert endpoint(request) == "/chat/completions"
    assert body == {
        "model": "qwen3.5-122b", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0.2, "seed": 3,
        "messages": [{"role": "user", "content": "hi"}], "stop": ["\n\n"],
    }


def test_sampling_nobody_asked_for_is_left_to_the_backends_defaults():
    plain = request_body(GenerationRequest(request_id="r", max_tokens=1, prompt="x"), "m")
    assert not {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "logit_bias"} & plain.keys()
    everything = frozenset({"temperature", "top_k", "min_p", "repetition_penalty"})
    tuned = request_body(
        GenerationRequest(request_id="r", max_tokens=1, prompt="x", sampling_set=everything,
                          sampling=SamplingParams(temperature=0, top_k=40, repetition_penalty=1.1)), "m")
    assert (tuned["temperature"], tuned["top_k"], tuned["repetition_penalty"]) == (0, 40, 1.1)
    assert "min_p" not in tuned, "a neutral value of a non-OpenAI field is not sent"
    assert endpoint(GenerationRequest(request_id="r", max_tokens=1, prompt="x")) == "/completions"


def test_tool_call_arguments_go_back_on_the_wire_as_json_text():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"city": "Oslo"}}}
    request = GenerationRequest(request_id="r", max_tokens=1, messages=[{"role": "assistant", "content": "", "tool_calls": [call]}])
    sent = request_body(request, "m")["messages"][0]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent) == {"city": "Oslo"}


def feed(reader, payload):
    return reader.feed(b"data: " + (payload if isinstance(payload, str) else json.dumps(payload)).encode() + b"\n\n")


def test_the_finish_waits_for_the_usage_that_follows_it():
    reader = StreamReader()
    assert feed(reader, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}) is None
    assert feed(reader, {"choices": [{"delta": {"content": "Hel"}}]}).text == "Hel"
    assert reader.feed(b": heartbeat\n\n") is None
    assert feed(reader, {"choices": [{"delta": {}, "finish_reason": "length"}]}) is None
    feed(reader, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                           "prompt_tokens_details": {"cached_tokens": 4}}})
    feed(reader, "[DONE]")
    assert reader.done
    last = reader.finish()
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens, last.cached_tokens) == ("length", 5, 2, 4)


def test_completions_text_is_read_too():
    reader = StreamReader()
    assert feed(reader, {"choices": [{"text": "Once", "finish_reason": None}]}).text == "Once"


def test_a_stream_that_ends_unfinished_or_reports_an_error_is_a_bad_gateway():
    with pytest.raises(BackendFailed, match="before the answer was finished"):
        StreamReader().finish()
    with pytest.raises(BackendFailed, match=r"^Backend `gpu` failed mid-answer \(server_error\)$") as failed:
        feed(StreamReader("gpu"), {"error": {"message": "CUDA out of memory at /opt/vllm/worker.py:123",
                                             "type": "server_error"}})
    assert failed.value.detail == "CUDA out of memory at /opt/vllm/worker.py:123", "the backend's words go to the log"
    assert failed.value.headers() == {"Retry-After": "5"}
    with pytest.raises(BackendFailed, match="not JSON"):
        feed(StreamReader(), "{oops")


def test_upstream_errors_keep_a_4xx_and_its_message_and_turn_5xx_into_502():
    body = json.dumps({"error": {"message": "max_tokens is too large", "type": "invalid_request_error",
                                 "param": "max_tokens", "code": "invalid_value"}}).encode()
    rejected = upstream_error("studio", 400, body, None)
    assert isinstance(rejected, UpstreamRejected) and rejected.status_code == 400
    assert rejected.body()["error"] == {"message": "max_tokens is too large", "type": "invalid_request_error",
                                        "param": "max_tokens", "code": "invalid_value"}
    busy = upstream_error("studio", 429, b"{}", "7")
    assert busy.status_code == 429 and busy.headers() == {"Retry-After": "7"}
    broken = upstream_error("studio", 500, b"<html>oops</html>", None)
    assert broken.status_code == 502 and "Retry-After" in broken.headers()
    assert "Backend `studio` failed (500)" in broken.message
    leaky = upstream_error("studio", 500, json.dumps({"error": {"message": "OOM at /opt/vllm/worker.py"}}).encode(), None)
    assert leaky.message == "Backend `studio` failed (500)" and leaky.detail == "OOM at /opt/vllm/worker.py"
    vllm_style = upstream_error("gpu", 404, json.dumps({"detail": "Not Found"}).encode(), None)
    assert vllm_style.status_code == 404 and vllm_style.message == "Not Found"


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_the_answers_shape_goes_out_as_the_client_asked_for_it():
    # A chat client's fields, parsed by its surface and rendered back for the wire.
    choice = {"type": "function", "function": {"name": "get_weather"}}
    output = OutputRequest(tools=chat_tools([WEATHER_TOOL]), tool_choice=chat_tool_choice(choice),
                           parallel_tool_calls=False)
    request = GenerationRequest(
        request_id="r", max_tokens=9, messages=[{"role": "user", "content": "hi"}], output=output,
    )
    body = request_body(request, "m")
    assert body["tools"] == [WEATHER_TOOL]
    assert body["tool_choice"] == choice
    assert body["parallel_tool_calls"] is False
    assert "response_format" not in body
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}}
    output = OutputRequest(response_format=chat_response_format(schema))
    shaped = request_body(GenerationRequest(request_id="r", max_tokens=9, messages=[], output=output), "m")
    assert shaped["response_format"] == schema and "tools" not in shaped


def test_images_go_out_in_place_as_data_urls():
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "this?"}, {"type": "image"}]},
    ]
    urls = ["data:image/png;base64,AAA", "data:image/jpeg;base64,BBB", "data:image/webp;base64,CCC"]
    sent = request_body(GenerationRequest(request_id="r", max_tokens=1, messages=messages, images=urls), "m")["messages"]
    assert sent[0]["content"] == [
        {"type": "image_url", "image_url": {"url": urls[0]}}, {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": urls[1]}},
    ]
    assert sent[1] == {"role": "assistant", "content": "two"}
    assert sent[2]["content"][1] == {"type": "image_url", "image_url": {"url": urls[2]}}
    assert messages[0]["content"][0] == {"type": "image"}, "the engine request itself is left as it was"


def test_streamed_tool_call_deltas_become_fragments_named_once():
    reader = StreamReader()
    first = feed(reader, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}}]})
    assert [(f.index, f.id, f.name, f.arguments) for f in first.tool_calls] == [(0, "call_1", "get_weather", "")]
    assert first.text == ""
    # Some servers repeat the id and name on every piece: they go out once.
    more = feed(reader, {"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": '}}]}}]})
    assert [(f.id, f.name, f.arguments) for f in more.tool_calls] == [(None, None, '{"city": ')]
    second = feed(reader, {"choices": [{"delta": {"tool_calls": [
        {"index": 1, "function": {"name": "add", "arguments": {"a": 1}}}]}}]})
    call = second.tool_calls[0]
    assert call.index == 1 and call.id.startswith("call_") and call.name == "add"
    assert json.loads(call.arguments) == {"a": 1}, "an object is sent on as JSON text"
    feed(reader, {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    assert reader.finish().finish_reason == "tool_calls"


def test_a_whole_json_answer_reads_like_a_stream():
    body = json.dumps({
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "add", "arguments": "{}"}}]}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4},
    }).encode()
    calls, finish = whole_answer(body)
    assert [(f.index, f.id, f.name, f.arguments) for f in calls.tool_calls] == [(0, "c9", "add", "{}")]
    assert (finish.finish_reason, finish.prompt_tokens, finish.completion_tokens) == ("tool_calls", 11, 4)
    with pytest.raises(BackendFailed, match="not JSON"):
        whole_answer(b"<html>")


def test_events_are_read_as_their_bytes_arrive_and_those_of_one_read_go_out_as_one_chunk():
    reader = StreamReader()
    event = 'data: {"choices":[{"delta":{"content":"%s"}}]}\r\n\r\n'
    whole = (event % "Hél" + event % "lo").encode()
    cut = whole.index("é".encode()) + 1  # inside a multi-byte character
    assert reader.feed(whole[:cut]) is None, "nothing is complete yet"
    assert reader.feed(whole[cut:]).text == "Héllo", "two events, one chunk"
    assert reader.feed(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n') is None
    assert reader.done and reader.finish().finish_reason == "stop"
    assert reader.feed(event.encode() % b"late") is None, "nothing counts after [DONE]"


def event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def text_event(text: str) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": text}}]})


def test_an_event_may_span_several_data_lines_joined_by_a_newline():
    reader = StreamReader()
    assert reader.feed(b'data: {"choices": [{"delta":\ndata: {"content": "a\\nb"}}]}\n\n').text == "a\nb"
    # "data:" without a space, and other fields, are SSE too.
    assert reader.feed(b'event: message\nid: 7\ndata:{"choices":[{"delta":{"content":"c"}}]}\n\n').text == "c"


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_lines_end_at_lf_crlf_or_a_bare_cr_even_when_a_read_cuts_between_them(newline):
    stream = (text_event("Hel") + text_event("lo")).replace(b"\n", newline)
    for cut in range(len(stream) + 1):
        reader = StreamReader()
        chunks = [reader.feed(stream[:cut]), reader.feed(stream[cut:])]
        assert "".join(c.text for c in chunks if c is not None) == "Hello", cut
        assert reader.events == 2


def test_a_last_event_without_its_newline_is_complete_at_a_clean_end_of_stream():
    reader = StreamReader()
    assert reader.feed(text_event("Hi") + b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}') .text == "Hi"
    assert reader.finish_reason is None, "the event is not over until its line is"
    assert reader.close() is None
    assert reader.finish().finish_reason == "stop"


def test_a_long_line_is_assembled_in_linear_time_and_bounded():
    reader = StreamReader()
    piece = b"a" * 65536
    reader.feed(b'data: {"choices":[{"delta":{"content":"')
    for _ in range(64):  # 4 MiB of one line, 64 reads: each scans only its own bytes
        assert reader.feed(piece) is None
    assert reader._line_bytes < MAX_EVENT_BYTES and len(reader._line) == 65
    chunk = reader.feed(b'"}}]}\n\n')
    assert chunk.text == "a" * 64 * 65536
    assert not reader._line and not reader._data
    with pytest.raises(BackendFailed, match="sent an event larger than 8 MiB") as failed:
        endless = StreamReader("gpu")
        endless.feed(b"data: ")
        for _ in range(MAX_EVENT_BYTES // len(piece) + 1):
            endless.feed(piece)
    assert failed.value.message.startswith("Backend `gpu`") and failed.value.headers() == {"Retry-After": "5"}
    with pytest.raises(BackendFailed, match="larger than"):
        # Many data lines of one event count together.
        StreamReader().feed((b"data: " + piece + b"\n") * (MAX_EVENT_BYTES // len(piece) + 1))


def test_tool_call_indices_are_relabelled_densely_in_order_of_first_naming():
    reader = StreamReader()
    named = reader.feed(event({"choices": [{"delta": {"tool_calls": [
        {"index": 3000000, "id": "a", "function": {"name": "f", "arguments": "{"}},
        {"index": -1, "function": {"name": "g", "arguments": ""}}]}}]}))
    more = reader.feed(event({"choices": [{"delta": {"tool_calls": [
        {"index": -1, "function": {"arguments": "{}"}}, {"index": 2, "function": {"name": "h"}}]}}]}))
    assert [(f.index, f.id, f.name, f.arguments) for f in named.tool_calls] == [(0, "a", "f", "{"), (1, named.tool_calls[1].id, "g", "")]
    assert named.tool_calls[1].id.startswith("call_")
    assert [(f.index, f.name, f.arguments) for f in more.tool_calls] == [(1, None, "{}"), (2, "h", "")]


def test_a_call_goes_out_once_named_and_one_never_named_is_no_call():
    reader = StreamReader()
    assert reader.feed(event({"choices": [{"delta": {"tool_calls": [
        {"index": 5, "id": "c5", "function": {"arguments": '{"a":'}}]}}]})) is None
    later = reader.feed(event({"choices": [{"delta": {"tool_calls": [
        {"index": 5, "function": {"name": "f", "arguments": "1}"}}]}}]}))
    assert [(f.index, f.id, f.name, f.arguments) for f in later.tool_calls] == [(0, "c5", "f", '{"a":1}')]
    assert reader.feed(event({"choices": [{"delta": {"tool_calls": [{"index": 9, "function": {"arguments": "x"}}]}}]})) is None


def test_more_distinct_tool_calls_than_the_cap_is_a_bad_gateway():
    reader = StreamReader()
    calls = [{"index": i, "function": {"name": "f"}} for i in range(MAX_TOOL_CALLS)]
    assert len(reader.feed(event({"choices": [{"delta": {"tool_calls": calls}}]})).tool_calls) == MAX_TOOL_CALLS
    with pytest.raises(BackendFailed, match=f"more than {MAX_TOOL_CALLS} tool calls"):
        reader.feed(event({"choices": [{"delta": {"tool_calls": [{"index": -7, "function": {"name": "f"}}]}}]}))


def test_a_completions_answer_ignores_chat_tool_calls():
    reader = StreamReader(chat=False)
    chunk = reader.feed(event({"choices": [{"text": "x", "delta": None}]}))
    assert chunk.text == "x"
    assert reader.feed(event({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "f", "arguments": "{}"}}]}}]})) is None


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": "five", "completion_tokens": [1]}, [1], {"a": 1}, "x",
    {"prompt_tokens": -5, "completion_tokens": 1e999, "prompt_tokens_details": {"cached_tokens": "x"}},
    {"prompt_tokens": float("nan"), "completion_tokens": True, "prompt_tokens_details": [3]},
    {"prompt_tokens": 10**30, "completion_tokens": "-3"},
])
def test_usage_that_is_not_a_count_counts_as_zero_and_fails_nothing(usage):
    reader = StreamReader()
    reader.feed(event({"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    reader.feed(event({"choices": [], "usage": usage}))
    last = reader.finish()
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (0, 0, 0)


def test_usage_as_numeric_strings_counts():
    reader = StreamReader()
    reader.feed(event({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {
        "prompt_tokens": "5", "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": "4"}}}))
    last = reader.finish()
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (5, 2, 4)


@pytest.mark.parametrize("payload, message", [
    ({"choices": 5}, "`choices` that is not a list"),
    ({"choices": [5]}, "a choice that is not an object"),
    ({"choices": [{"delta": {}, "finish_reason": "abort"}]}, "aborted the answer"),
    ([1, 2], "not a JSON object"),
])
def test_malformed_choices_are_a_bad_gateway(payload, message):
    with pytest.raises(BackendFailed, match=message) as failed:
        StreamReader("gpu").feed(b"data: " + json.dumps(payload).encode() + b"\n\n")
    assert failed.value.headers() == {"Retry-After": "5"}
    with pytest.raises(BackendFailed, match="not JSON"):
        StreamReader().feed(b"data: " + b"[" * 100000 + b"\n\n")


def test_only_the_first_choice_is_relayed_and_an_odd_finish_reason_reads_as_stop():
    reader = StreamReader()
    chunk = reader.feed(event({"choices": [{"index": 1, "delta": {"content": "other"}, "finish_reason": "length"},
                                           {"index": 0, "delta": {"content": "mine"}}]}))
    assert chunk.text == "mine" and reader.finish_reason is None
    reader.feed(event({"choices": [{"index": 0, "delta": {}, "finish_reason": {"x": 1}}]}))
    assert reader.finish().finish_reason == "stop"


def test_a_null_error_field_is_no_error():
    assert StreamReader().feed(event({"error": None, "choices": [{"delta": {"content": "ok"}}]})).text == "ok"


def test_the_first_event_is_what_accepts_the_request():
    reader = StreamReader()
    assert reader.feed(b": keep-alive\n\n") is None and reader.events == 0
    assert reader.feed(b"<html>\n\n") is None and reader.events == 0
    assert reader.feed(event({"choices": [{"delta": {"role": "assistant", "content": ""}}]})) is None
    assert reader.events == 1


def test_error_bodies_pass_only_string_fields_and_fastapi_details_read_as_text():
    odd = json.dumps({"error": {"message": {"nested": "obj"}, "type": 123, "param": ["p"], "code": 7}}).encode()
    rejected = upstream_error("studio", 400, odd, None)
    assert rejected.body()["error"] == {"message": "Backend `studio` rejected the request (400)",
                                        "type": "invalid_request_error", "param": None, "code": "upstream_error"}
    fastapi = json.dumps({"detail": [{"loc": ["body", "n"], "msg": "n must be 1", "type": "value_error"},
                                     {"msg": "and so on"}]}).encode()
    assert upstream_error("gpu", 422, fastapi, None).message == "n must be 1; and so on"


def test_a_whole_answer_is_read_with_the_same_rules():
    body = json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "hi", "tool_calls": [
        {"index": 2, "function": {"name": "f", "arguments": "{}"}}]}}], "usage": {"prompt_tokens": -5}}).encode()
    chunk, finish = whole_answer(body)
    assert [(f.index, f.name) for f in chunk.tool_calls] == [(0, "f")]
    assert finish.prompt_tokens == 0
    assert whole_answer(body, chat=False)[0].tool_calls is None


def test_a_continued_message_goes_out_with_vllms_fields():
    """Without them a backend would answer a prefill in a new turn, not go on from it."""
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Here is {"}]
    continued = request_body(GenerationRequest(request_id="r", max_tokens=1, messages=messages,
                                               prompt_end="continue"), "m")
    assert (continued["continue_final_message"], continued["add_generation_prompt"]) == (True, False)
    as_is = request_body(GenerationRequest(request_id="r", max_tokens=1, messages=messages, prompt_end="as_is"), "m")
    assert as_is["add_generation_prompt"] is False and "continue_final_message" not in as_is
    plain = request_body(GenerationRequest(request_id="r", max_tokens=1, messages=messages), "m")
    assert not {"continue_final_message", "add_generation_prompt"} & plain.keys()
