"""Anthropic's message JSON and stream events, from the shared Answer and
output events."""

from __future__ import annotations

import json
from typing import Any

from mlxd.api.anthropic.error_shape import error_body
from mlxd.api.anthropic.signatures import sign
from mlxd.api.events import Finish, OutputEvent, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from mlxd.api.frames import MARK, cut, encode, encode_text
from mlxd.api.generation import Answer
from mlxd.api.plan import Plan

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def stop_reason(reason: str, stop_sequence: str | None = None) -> str:
    if reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(reason, "end_turn")


def usage_body(usage: Usage) -> dict[str, int]:
    # Anthropic counts cached prompt tokens apart from input_tokens: the
    # prompt is input_tokens + cache_read_input_tokens.
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: str) -> Any:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# A shown thinking block's signature. Anthropic's proves the block came from
# its model; mlxd's proves nothing, and a block whose reasoning is not shown
# carries that reasoning in its own (signatures.py).
SIGNATURE = ""


def message_id(plan: Plan) -> str:
    return plan.id


def message(plan: Plan, answer: Answer) -> dict[str, Any]:
    choice = answer.choices[0] if answer.choices else None
    content: list[dict[str, Any]] = []
    if choice is not None and choice.reasoning:
        if plan.reasoning.omitted:
            content.append({"type": "thinking", "thinking": "", "signature": sign(choice.reasoning)})
        else:
            content.append({"type": "thinking", "thinking": choice.reasoning, "signature": SIGNATURE})
    # A text block even when empty, unless another block says what the answer
    # was: a reply cut while thinking is its thinking block alone, as the
    # stream sends it and Anthropic answers (which refuses empty text blocks
    # sent back).
    if choice is not None and (choice.text or not (choice.tool_calls or choice.reasoning)):
        content.append({"type": "text", "text": choice.text})
    for call in choice.tool_calls if choice else ():
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call.arguments)})
    return {
        "id": message_id(plan),
        "type": "message",
        "role": "assistant",
        "model": plan.requested_name,
        "content": content,
        "stop_reason": stop_reason(choice.finish_reason, choice.stop_sequence) if choice else "end_turn",
        "stop_sequence": choice.stop_sequence if choice else None,
        "usage": usage_body(answer.usage),
    }


def event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {encode({'type': name, **payload})}\n\n"


PING = event("ping", {})


class AnthropicFrames:
    """message_start, then per content block content_block_start / _delta /
    _stop, then message_delta (stop reason, usage) and message_stop; ``ping``
    while the request waits for a lease, a load or a long prefill."""

    heartbeat = PING
    # message_start goes out at once and pings follow while the request is
    # queued or its model loads: Claude Code never waits minutes for a byte.
    early = True

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._index = -1
        self._open: str | None = None  # "thinking", "text" or "tool_use"
        self._call = -1
        # The text block's delta frame around its text (mlxd.api.frames), for its index.
        self._text_frame: tuple[int, str, str] | None = None
        # thinking.display "omitted": the open thinking block's reasoning, for its signature.
        self._hidden = ""

    def opening(self) -> str:
        start = {
            "id": message_id(self.plan),
            "type": "message",
            "role": "assistant",
            "model": self.plan.requested_name,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return event("message_start", {"message": start}) + PING

    def _start(self, block: dict[str, Any]) -> str:
        out = self._stop()
        self._index += 1
        self._open = block["type"]
        return out + event("content_block_start", {"index": self._index, "content_block": block})

    def _stop(self) -> str:
        if self._open is None:
            return ""
        # A thinking block ends with its signature, as Anthropic's do.
        out = ""
        if self._open == "thinking":
            signature = sign(self._hidden) if self.plan.reasoning.omitted else SIGNATURE
            out, self._hidden = self._delta({"type": "signature_delta", "signature": signature}), ""
        self._open = None
        return out + event("content_block_stop", {"index": self._index})

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"index": self._index, "delta": delta})

    def _text_delta(self, text: str, kind: str = "text_delta", key: str = "text") -> str:
        frame = self._text_frame
        if frame is None or frame[0] != self._index:
            frame = self._text_frame = (self._index, *cut(self._delta({"type": kind, key: MARK})))
        return frame[1] + encode_text(text) + frame[2]

    def event(self, item: OutputEvent) -> str:
        if isinstance(item, ReasoningDelta):
            out = "" if self._open == "thinking" else self._start({"type": "thinking", "thinking": "", "signature": ""})
            if self.plan.reasoning.omitted:
                # The block opens and closes with its signature (which holds the reasoning), no text.
                self._hidden += item.text
                return out
            return out + self._text_delta(item.text, "thinking_delta", "thinking")
        if isinstance(item, TextDelta):
            out = "" if self._open == "text" else self._start({"type": "text", "text": ""})
            return out + self._text_delta(item.text)
        if isinstance(item, ToolCallDelta):
            out = ""
            if item.name is not None and item.index != self._call:
                self._call = item.index
                out = self._start({"type": "tool_use", "id": item.id or "", "name": item.name, "input": {}})
            if item.arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": item.arguments})
            return out
        assert isinstance(item, Finish)
        out = self._start({"type": "text", "text": ""}) if self._index < 0 else ""
        out += self._stop()
        return out + event(
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason(item.reason, item.stop_sequence), "stop_sequence": item.stop_sequence},
                "usage": usage_body(item.usage),
            },
        )

    def error(self, exc: BaseException) -> str:
        return event("error", {"error": error_body(exc)["error"]})

    def closing(self, usage: Usage | None) -> str:
        return event("message_stop", {}) if usage is not None else ""
