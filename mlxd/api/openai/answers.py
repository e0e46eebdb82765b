"""OpenAI's JSON answers and stream chunks, from the shared Answer and
output events."""

from __future__ import annotations

import json
from typing import Any

from mlxd.api.events import Finish, OutputEvent, TextDelta, ToolCallDelta, Usage
from mlxd.api.generation import Answer, CalledTool
from mlxd.api.openai.errors import error_body
from mlxd.api.plan import Plan


def usage_body(usage: Usage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens:
        body["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return body


def _tool_calls(calls: list[CalledTool]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def chat_completion(plan: Plan, answer: Answer) -> dict[str, Any]:
    choice = answer.choices[0]
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["tool_calls"] = _tool_calls(choice.tool_calls)
    return {
        "id": plan.id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.requested_name,
        "choices": [
            {"index": 0, "message": message, "finish_reason": choice.finish_reason, "logprobs": None}
        ],
        "usage": usage_body(answer.usage),
    }


def text_completion(plan: Plan, answer: Answer) -> dict[str, Any]:
    return {
        "id": plan.id,
        "object": "text_completion",
        "created": plan.created,
        "model": plan.requested_name,
        "choices": [
            {"index": i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
            for i, c in enumerate(answer.choices)
        ],
        "usage": usage_body(answer.usage),
    }


# --- streams ------------------------------------------------------------------
# OpenAI clients expect exactly "data: [DONE]\n\n" at the end.


def sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


DONE = "data: [DONE]\n\n"
HEARTBEAT = ": heartbeat\n\n"


class OpenAIFrames:
    """Chunk objects for chat and completions streams (``chat`` picks which)."""

    heartbeat = HEARTBEAT

    def __init__(self, plan: Plan, *, chat: bool, include_usage: bool) -> None:
        self.plan = plan
        self.chat = chat
        self.include_usage = include_usage

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.plan.id, "object": kind, "created": self.plan.created, "model": self.plan.requested_name}

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        return {**self._base(), "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def _text_chunk(self, text: str, finish: str | None, index: int) -> dict[str, Any]:
        return {**self._base(), "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": None}]}

    def opening(self) -> str:
        return sse(self._chat_chunk({"role": "assistant", "content": ""}, None)) if self.chat else ""

    def event(self, event: OutputEvent) -> str:
        if isinstance(event, TextDelta):
            if self.chat:
                return sse(self._chat_chunk({"content": event.text}, None, event.choice))
            return sse(self._text_chunk(event.text, None, event.choice))
        if isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index, "function": {"arguments": event.arguments}}
            if event.id is not None:
                call["id"] = event.id
                call["type"] = "function"
            if event.name is not None:
                call["function"]["name"] = event.name
            return sse(self._chat_chunk({"tool_calls": [call]}, None, event.choice))
        assert isinstance(event, Finish)
        if self.chat:
            frame = self._chat_chunk({}, event.reason, event.choice)
        else:
            frame = self._text_chunk("", event.reason, event.choice)
        frame["usage"] = usage_body(event.usage)
        return sse(frame)

    def error(self, exc: BaseException) -> str:
        return sse(error_body(exc))

    def closing(self, usage: Usage | None) -> str:
        if usage is not None and self.include_usage:
            return sse({**self._base(), "choices": [], "usage": usage_body(usage)}) + DONE
        return DONE
