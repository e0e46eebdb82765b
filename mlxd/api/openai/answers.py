"""OpenAI's JSON answers and stream chunks, from the shared Answer and
output events."""

from __future__ import annotations

from typing import Any

from mlxd.api.events import Finish, Logprobs, OutputEvent, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from mlxd.api.frames import MARK, cut, encode, encode_text
from mlxd.api.generation import Answer, CalledTool, Choice
from mlxd.api.openai.error_shape import error_body
from mlxd.api.plan import Plan


def usage_body(usage: Usage) -> dict[str, Any]:
    # Both details always, 0 included, as OpenAI answers them: left out when
    # 0, code written against OpenAI (``usage.prompt_tokens_details
    # .cached_tokens``, from its prompt-caching guide) failed on None at a cold prompt.
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _tool_calls(calls: list[CalledTool]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        # As OpenAI answers a call with nothing before it: no content at all.
        message["content"] = choice.text or None
        message["tool_calls"] = _tool_calls(choice.tool_calls)
    if choice.reasoning:
        # ``reasoning_content`` as vLLM and DeepSeek name it, ``reasoning`` as
        # mlx_lm.server and OpenRouter do: clients read one or the other.
        message["reasoning_content"] = message["reasoning"] = choice.reasoning
    return message


def _logprob(token: str, raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(raw)}


def logprobs_body(entries: list[Any]) -> dict[str, Any]:
    """OpenAI's ``choices[].logprobs`` from mlxd.engine.logprobs.TokenLogprob entries."""
    return {
        "content": [
            {**_logprob(e.token, e.raw, e.logprob), "top_logprobs": [_logprob(*alternative) for alternative in e.top]}
            for e in entries
        ],
        "refusal": None,
    }


def chat_usage(plan: Plan, usage: Usage) -> Usage:
    """n choices of one prompt: the prompt counts once, as OpenAI counts it."""
    n = plan.prompt_copies
    return Usage(usage.prompt_tokens // n, usage.completion_tokens, usage.cached_tokens // n, usage.reasoning_tokens)


def chat_completion(plan: Plan, answer: Answer) -> dict[str, Any]:
    return {
        "id": plan.id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.requested_name,
        "choices": [
            {
                "index": i,
                "message": _message(c),
                "finish_reason": c.finish_reason,
                "logprobs": logprobs_body(c.logprobs) if plan.requests[0].logprobs is not None else None,
            }
            for i, c in enumerate(answer.choices)
        ],
        "usage": usage_body(chat_usage(plan, answer.usage)),
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
    data = payload if isinstance(payload, str) else encode(payload)
    return f"data: {data}\n\n"


DONE = "data: [DONE]\n\n"
HEARTBEAT = ": heartbeat\n\n"


def _may_call(plan: Plan) -> bool:
    choice = plan.output.tool_choice
    return bool(plan.output.tools) and (choice is None or choice.mode != "none")


class OpenAIFrames:
    """Chunk objects for chat and completions streams (``chat`` picks which)."""

    heartbeat = HEARTBEAT
    # OpenAI clients read a 503 or 504 from the status code: acquire first.
    early = False

    def __init__(self, plan: Plan, *, chat: bool, include_usage: bool) -> None:
        self.plan = plan
        self.chat = chat
        self.include_usage = include_usage
        # Per choice: a text delta's frame around its text. Text frames are
        # nearly every frame of a stream; encoding only the text saves
        # building and encoding the whole chunk object per token.
        self._text_frames: dict[int, tuple[str, str]] = {}
        self._reasoning_frames: dict[int, tuple[str, str, str]] = {}

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.plan.id, "object": kind, "created": self.plan.created, "model": self.plan.requested_name}

    def _chat_chunk(self, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        return {**self._base(), "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def _text_chunk(self, text: str, finish: str | None, index: int) -> dict[str, Any]:
        return {**self._base(), "choices": [{"index": index, "text": text, "finish_reason": finish, "logprobs": None}]}

    def opening(self) -> str:
        if not self.chat:
            return ""
        # A call's message has no content (null, as the whole answer says);
        # opened with "", the SDK's stream accumulator gave it "" instead,
        # so an answer that may call opens with null, as OpenAI's calls do.
        # Text still accumulates the same (null takes the first delta).
        opening = {"role": "assistant", "content": None if _may_call(self.plan) else ""}
        return "".join(sse(self._chat_chunk(opening, None, i)) for i in range(max(1, len(self.plan.requests))))

    def _text_frame(self, text: str, index: int) -> str:
        parts = self._text_frames.get(index)
        if parts is None:
            frame = self._chat_chunk({"content": MARK}, None, index) if self.chat else \
                self._text_chunk(MARK, None, index)
            parts = self._text_frames[index] = cut(sse(frame))
        return parts[0] + encode_text(text) + parts[1]

    def _reasoning_frame(self, text: str, index: int) -> str:
        parts = self._reasoning_frames.get(index)
        if parts is None:
            # Both names, as in the whole answer's message: the template is
            # cut around its two marks, and the same text goes in each.
            frame = sse(self._chat_chunk({"reasoning_content": MARK, "reasoning": MARK}, None, index))
            head, tail = cut(frame)
            first, second = cut(head)
            parts = self._reasoning_frames[index] = (first, second, tail)
        piece = encode_text(text)
        return parts[0] + piece + parts[1] + piece + parts[2]

    def event(self, event: OutputEvent) -> str:
        if isinstance(event, TextDelta):
            return self._text_frame(event.text, event.choice)
        if isinstance(event, ReasoningDelta):
            return self._reasoning_frame(event.text, event.choice)
        if isinstance(event, ToolCallDelta):
            call: dict[str, Any] = {"index": event.index, "function": {"arguments": event.arguments}}
            if event.id is not None:
                call["id"] = event.id
                call["type"] = "function"
            if event.name is not None:
                call["function"]["name"] = event.name
            return sse(self._chat_chunk({"tool_calls": [call]}, None, event.choice))
        if isinstance(event, Logprobs):
            frame = self._chat_chunk({}, None, event.choice)
            frame["choices"][0]["logprobs"] = logprobs_body(list(event.entries))
            return sse(frame)
        assert isinstance(event, Finish)
        # No usage here: OpenAI sends it once, in the last chunk, and only
        # when stream_options.include_usage asks (``closing``). On every
        # choice's finish too (as vllm-mlx does), it was counted once per
        # chunk by clients that add up what chunks carry: LangChain's
        # stream_usage reported twice the tokens of the same request unstreamed.
        if self.chat:
            return sse(self._chat_chunk({}, event.reason, event.choice))
        return sse(self._text_chunk("", event.reason, event.choice))

    def _usage(self, usage: Usage) -> Usage:
        return chat_usage(self.plan, usage) if self.chat else usage

    def error(self, exc: BaseException) -> str:
        return sse(error_body(exc))

    def closing(self, usage: Usage | None) -> str:
        if usage is not None and self.include_usage:
            return sse({**self._base(), "choices": [], "usage": usage_body(self._usage(usage))}) + DONE
        return DONE
