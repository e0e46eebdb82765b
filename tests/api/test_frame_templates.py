"""Text-delta frames filled from per-stream templates (mlxd.api.frames) are
byte for byte what encoding the whole event would give, with the text
intact, on every surface: a client's SSE parser sees no difference."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mlxd.api.anthropic.answers import AnthropicFrames
from mlxd.api.events import TextDelta, ToolCallDelta
from mlxd.api.openai.answers import OpenAIFrames
from mlxd.api.responses.answers import ResponsesFrames
from mlxd.api.responses.bodies import ResponsesRequest

# Quotes, escapes, control characters, the template's own markers, non-ASCII.
TEXTS = ["Hello", ' "quoted" ', "back\\slash", "line\nbreak\ttab", "\x00", "\x01\x1f", "-7770777",
         "héllo wörld", "日本語", "🙂 emoji", "\u2028\u2029", "", "}}\n\n", "data: [DONE]"]


def canonical(payload: str) -> dict:
    """The event's JSON, after checking it is exactly what the encoder writes."""
    data = json.loads(payload)
    assert payload == json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return data


def events_of(stream: str) -> list[tuple[str | None, str]]:
    """(event name, data) of every frame in an SSE text."""
    out = []
    for frame in stream.split("\n\n"):
        if not frame:
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines.get("event"), lines["data"]))
    return out


PLAN = SimpleNamespace(id="chatcmpl-1", created=1, requested_name="m", requests=[None])


def texts_around_a_call(frames) -> list[tuple[str | None, str]]:
    """Every text, then a tool call (which opens a block or item of its own),
    then every text again (which opens a third)."""
    seen = []
    for text in TEXTS:
        seen += events_of(frames.event(TextDelta(0, text)))
    seen += events_of(frames.event(ToolCallDelta(0, 0, "t1", "f", '{"a":1}')))
    for text in TEXTS:
        seen += events_of(frames.event(TextDelta(0, text)))
    return seen


@pytest.mark.parametrize("chat", [True, False])
def test_openai_text_frames_are_what_the_encoder_writes(chat):
    frames = OpenAIFrames(PLAN, chat=chat, include_usage=False)
    for choice in (0, 1):
        for text in TEXTS:
            ((_, payload),) = events_of(frames.event(TextDelta(choice, text)))
            data = canonical(payload)
            first = data["choices"][0]
            assert first["index"] == choice
            assert (first["delta"]["content"] if chat else first["text"]) == text


def test_anthropic_text_frames_are_what_the_encoder_writes_in_each_block():
    seen = texts_around_a_call(AnthropicFrames(PLAN))
    deltas = [canonical(d) for name, d in seen if name == "content_block_delta"]
    texts = [d["delta"]["text"] for d in deltas if d["delta"]["type"] == "text_delta"]
    assert texts == TEXTS + TEXTS
    indices = [d["index"] for d in deltas if d["delta"]["type"] == "text_delta"]
    assert indices == [0] * len(TEXTS) + [2] * len(TEXTS)


def test_responses_text_frames_are_what_the_encoder_writes_with_running_sequence_numbers():
    body = ResponsesRequest(model="m", input="x")
    seen = texts_around_a_call(ResponsesFrames(PLAN, body, SimpleNamespace(), ()))
    data = [canonical(d) for _, d in seen]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    deltas = [d for d in data if d["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == TEXTS + TEXTS
    # Each message its own item id and output index.
    first, second = deltas[0], deltas[-1]
    assert first["item_id"] != second["item_id"] and (first["output_index"], second["output_index"]) == (0, 2)
