"""Response objects and stream events of the Responses API, from the shared
Answer and output events. Every stream event carries ``type`` and
``sequence_number``; a stream ends in the event that names its outcome, as
OpenAI's do: ``response.completed``, ``response.incomplete`` (cut by
``max_output_tokens``; clients such as the OpenAI Agents SDK read the event's
type, not the status inside it) or ``response.failed``. The item an answer
was cut in, or open when it failed, says ``incomplete`` itself."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from mlxd.api.conversation import Message, ToolCall
from mlxd.api.events import Finish, OutputEvent, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from mlxd.api.frames import MARK, cut, encode, encode_text
from mlxd.api.generation import Answer
from mlxd.api.plan import Plan
from mlxd.api.responses.bodies import FIELDS, ResponsesRequest, flat_name, thoughts
from mlxd.api.responses.store import ResponseStore
from mlxd.errors import MlxdError


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, text: str, status: str = "completed", summary: bool = False) -> dict[str, Any]:
    """A thinking model's reasoning, in the open-weight form (``reasoning_text``
    content, as gpt-oss's Responses servers give it). ``summary``: the request
    asked for one (``reasoning.summary``); a local model writes none, so the
    reasoning itself is its summary, as Ollama gives it (Codex shows reasoning
    from the summary only)."""
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    summaries = [{"type": "summary_text", "text": text}] if summary and status != "in_progress" else []
    return {"type": "reasoning", "id": item_id, "summary": summaries, "content": content, "status": status}


def summary_asked(body: ResponsesRequest) -> bool:
    """Whether ``reasoning.summary`` asks for a summary (auto, concise, detailed)."""
    reasoning = getattr(body, "reasoning", None)
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    return reasoning.get("summary") in SUMMARIES


SUMMARIES = ("auto", "concise", "detailed")


def call_item(body: ResponsesRequest, item_id: str, call_id: str, called: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    """A call of the function the model named ``called``: a namespace's
    function by its name and its ``namespace``."""
    name, namespace = body.call_name(called)
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name}
    if namespace is not None:
        item["namespace"] = namespace
    return {**item, "arguments": arguments, "status": status}


@dataclass
class Outcome:
    """What the response says so far: its output items, status and usage."""

    output: list[dict[str, Any]] = field(default_factory=list)
    status: str = "in_progress"
    usage: Usage | None = None
    error: dict[str, Any] | None = None

    def output_message(self) -> Message:
        """The response's output as the next turn's history sees it."""
        text = "".join(
            p["text"] for item in self.output if item["type"] == "message" for p in item["content"]
        )
        calls = tuple(
            ToolCall(i["call_id"], flat_name(i.get("namespace"), i["name"]), i["arguments"])
            for i in self.output if i["type"] == "function_call"
        )
        thought = thoughts(*(p["text"] for item in self.output if item["type"] == "reasoning" for p in item["content"]))
        return Message("assistant", text, tool_calls=calls, reasoning=thought)


def response_object(plan: Plan, body: ResponsesRequest, outcome: Outcome) -> dict[str, Any]:
    text_format = (body.text or {}).get("format") or {"type": "text"}
    return {
        "id": plan.id,
        "object": "response",
        "created_at": plan.created,
        "status": outcome.status,
        "model": plan.requested_name,
        "output": outcome.output,
        "usage": usage_body(outcome.usage) if outcome.usage is not None else None,
        "error": outcome.error,
        "incomplete_details": {"reason": "max_output_tokens"} if outcome.status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        # What was done: a forced call is one call unless parallel calls were asked for.
        "parallel_tool_calls": bool(body.parallel_tool_calls),
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning,
        "store": body.store,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {"format": text_format},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [],
        "metadata": body.metadata or {},
    }


def _status(reason: str) -> str:
    return "incomplete" if reason == "length" else "completed"


def remember(store: ResponseStore, plan: Plan, body: ResponsesRequest, history: tuple[Message, ...], outcome: Outcome) -> None:
    if body.store:
        store.put(plan.id, plan.caller.name, (*history, outcome.output_message()), response_object(plan, body, outcome))


def complete_response(
    plan: Plan, body: ResponsesRequest, answer: Answer, store: ResponseStore, history: tuple[Message, ...]
) -> dict[str, Any]:
    choice = answer.choices[0]
    outcome = Outcome(status=_status(choice.finish_reason), usage=answer.usage)
    if choice.reasoning:
        outcome.output.append(reasoning_item(_item_id("rs"), choice.reasoning, summary=summary_asked(body)))
    if choice.text or not choice.tool_calls:
        outcome.output.append(message_item(_item_id("msg"), choice.text))
    for call in choice.tool_calls:
        outcome.output.append(call_item(body, _item_id("fc"), call.id, call.name, call.arguments))
    if outcome.status == "incomplete":
        # The answer was cut in its last item.
        outcome.output[-1]["status"] = "incomplete"
    remember(store, plan, body, history, outcome)
    return response_object(plan, body, outcome)


# Stands in for the sequence number while a text-delta template is made: no
# real one is negative.
_SEQUENCE_MARK = -7_770_777


class ResponsesFrames:
    heartbeat = ": heartbeat\n\n"
    # response.created goes out at once; waiting for the model then shows as
    # heartbeats, and a failure to get it as response.failed.
    early = True

    def __init__(
        self, plan: Plan, body: ResponsesRequest, store: ResponseStore, history: tuple[Message, ...]
    ) -> None:
        self.plan = plan
        self.body = body
        self.store = store
        self.history = history
        self.outcome = Outcome()
        self._summary = summary_asked(body)
        self._sequence = 0
        self._open: dict[str, Any] | None = None
        self._text = ""
        self._call = -1
        # The open message's text-delta frame around its sequence number and
        # its text (mlxd.api.frames), for that message and output index.
        self._text_frame: tuple[tuple[str, int], str, str, str] | None = None

    @staticmethod
    def _render(kind: str, sequence: int, payload: dict[str, Any]) -> str:
        return f"event: {kind}\ndata: {encode({'type': kind, 'sequence_number': sequence, **payload})}\n\n"

    def _event(self, kind: str, **payload: Any) -> str:
        self._sequence += 1
        return self._render(kind, self._sequence - 1, payload)

    def _text_delta(self, item_id: str, index: int, text: str) -> str:
        frame = self._text_frame
        if frame is None or frame[0] != (item_id, index):
            # logprobs: a field the event's type requires (the SDK's strict models fail without it); none here.
            payload = {"item_id": item_id, "output_index": index, "content_index": 0, "delta": MARK, "logprobs": []}
            head, tail = cut(self._render("response.output_text.delta", _SEQUENCE_MARK, payload))
            before, _, after = head.partition(str(_SEQUENCE_MARK))
            frame = self._text_frame = ((item_id, index), before, after, tail)
        self._sequence += 1
        return f"{frame[1]}{self._sequence - 1}{frame[2]}{encode_text(text)}{frame[3]}"

    def _response(self) -> dict[str, Any]:
        return response_object(self.plan, self.body, self.outcome)

    def opening(self) -> str:
        return self._event("response.created", response=self._response()) + self._event(
            "response.in_progress", response=self._response()
        )

    def _add(self, item: dict[str, Any]) -> str:
        out = self._close()
        self._open = item
        self._text = ""
        out += self._event("response.output_item.added", output_index=len(self.outcome.output), item=item)
        if item["type"] == "message":
            out += self._event(
                "response.content_part.added", item_id=item["id"], output_index=len(self.outcome.output),
                content_index=0, part={"type": "output_text", "text": "", "annotations": []},
            )
        return out

    def _close(self, status: str = "completed") -> str:
        """The open item's closing events; ``status`` is the item's own
        (``incomplete`` for the item an answer was cut or failed in)."""
        item, self._open = self._open, None
        if item is None:
            return ""
        index = len(self.outcome.output)
        if item["type"] == "reasoning":
            done = reasoning_item(item["id"], self._text, status, summary=self._summary)
            out = self._event(
                "response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                text=self._text,
            )
            if self._summary:
                part = {"type": "summary_text", "text": self._text}
                out += self._event("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                                   summary_index=0, text=self._text)
                out += self._event("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                                   summary_index=0, part=part)
        elif item["type"] == "message":
            done = message_item(item["id"], self._text, status)
            part = done["content"][0]
            out = self._event(
                "response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=self._text,
                logprobs=[],
            )
            out += self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            )
        else:
            done = {**item, "arguments": self._text, "status": status}
            out = self._event(
                "response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=self._text
            )
        self.outcome.output.append(done)
        return out + self._event("response.output_item.done", output_index=index, item=done)

    def event(self, event: OutputEvent) -> str:
        index = len(self.outcome.output)
        if isinstance(event, ReasoningDelta):
            opened = self._open is not None and self._open["type"] == "reasoning"
            out = "" if opened else self._add(reasoning_item(_item_id("rs"), "", status="in_progress"))
            item_id, index = self._open["id"], len(self.outcome.output)
            if not opened and self._summary:
                out += self._event("response.reasoning_summary_part.added", item_id=item_id, output_index=index,
                                   summary_index=0, part={"type": "summary_text", "text": ""})
            self._text += event.text
            out += self._event(
                "response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=event.text,
            )
            if self._summary:
                out += self._event("response.reasoning_summary_text.delta", item_id=item_id, output_index=index,
                                   summary_index=0, delta=event.text)
            return out
        if isinstance(event, TextDelta):
            out = "" if self._open is not None and self._open["type"] == "message" else self._add(
                message_item(_item_id("msg"), "", status="in_progress")
            )
            index = len(self.outcome.output)
            self._text += event.text
            return out + self._text_delta(self._open["id"], index, event.text)
        if isinstance(event, ToolCallDelta):
            out = ""
            if event.name is not None and event.index != self._call:
                self._call = event.index
                out = self._add(call_item(self.body, _item_id("fc"), event.id or "", event.name, "",
                                          status="in_progress"))
                index = len(self.outcome.output)
            if event.arguments:
                self._text += event.arguments
                out += self._event(
                    "response.function_call_arguments.delta", item_id=self._open["id"], output_index=index,
                    delta=event.arguments,
                )
            return out
        assert isinstance(event, Finish)
        self.outcome.status = _status(event.reason)
        reasoning_open = self._open is not None and self._open["type"] == "reasoning"
        out = self._close(self.outcome.status) if reasoning_open else ""
        answered = any(item["type"] != "reasoning" for item in self.outcome.output)
        if not answered and self._open is None:
            # An answer has a message, if only an empty one (after reasoning alone, too).
            out += self._add(message_item(_item_id("msg"), "", status="in_progress"))
        out += self._close(self.outcome.status)
        self.outcome.usage = event.usage
        return out

    def error(self, exc: BaseException) -> str:
        out = self._close("incomplete")
        self.outcome.status = "failed"
        exc = FIELDS.renamed(exc) if isinstance(exc, MlxdError) else exc
        code = exc.code if isinstance(exc, MlxdError) else "server_error"
        message = exc.message if isinstance(exc, MlxdError) else "Internal error during generation"
        self.outcome.error = {"code": code, "message": message}
        return out + self._event("response.failed", response=self._response())

    def closing(self, usage: Usage | None) -> str:
        if usage is None:
            return ""
        remember(self.store, self.plan, self.body, self.history, self.outcome)
        kind = "response.incomplete" if self.outcome.status == "incomplete" else "response.completed"
        return self._event(kind, response=self._response())
