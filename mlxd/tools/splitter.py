"""Split a model's output into text and tool calls, as it streams.

Text deltas go in (as the engine streams them); out come ``TextDelta`` and,
per call, ``ToolCallStart`` (id and name), ``ToolCallArguments`` (a fragment
of the arguments' JSON text) and ``ToolCallEnd`` — the OpenAI streaming
shape. Call markup never reaches the text: mlx-lm's ``TextStateMachine``
holds back anything that could be the start of a marker until it knows, so a
marker split across tokens (or deltas) is still recognised.

A call is handed to the family's parser (mlx-lm's) once it is closed, so its
arguments arrive as one fragment, already checked to be a whole call. A call
the parser rejects, or one the output ended in the middle of, is dropped and
counted (``dropped``), never shown as text.

Pure: no MLX, no I/O; ``split_answer`` is the same thing for a whole answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from mlxd.tools.formats import ToolFormat
from mlxd.tools.llama3 import PYTHON_TAG


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int


Event = Union[TextDelta, ToolCallStart, ToolCallArguments, ToolCallEnd]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallSplitter:
    """One answer's splitter; ``feed`` each text delta, then ``finish`` once."""

    def __init__(
        self, fmt: ToolFormat, tools: Any = None, *, new_id: Callable[[], str] = new_call_id
    ) -> None:
        from mlx_lm.generate import TextStateMachine

        self._fmt = fmt
        self._tools = tools
        self._new_id = new_id
        self.calls: list[ToolCall] = []
        self.dropped = 0
        self._call_text = ""
        # Llama 3 has no markers: the answer is a call if it starts like one.
        self._whole = not fmt.start
        self._decided = False
        self._is_call = False
        self._head = ""
        if not self._whole:
            transitions = {"normal": [(fmt.start, "tool")], "tool": [(fmt.end, "normal")] if fmt.end else []}
            self._machine = TextStateMachine(transitions)
            self._state = self._machine.make_state("normal")

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._whole:
            return self._feed_whole(text)
        from mlx_lm.generate import TextStateMachine

        self._state, segments = TextStateMachine.split(self._state, text)
        events: list[Event] = []
        previous = None
        for state, chunk in segments:
            if previous == "tool" and state == "normal":
                events += self._close_call()
            if state == "tool":
                self._call_text += chunk
            elif chunk:
                events.append(TextDelta(chunk))
            previous = state
        return _merge_text(events)

    def finish(self) -> list[Event]:
        """End of the output, whatever the reason: a call still open is
        parsed if it is whole (Mistral's calls have no end marker), else dropped."""
        if self._whole:
            return self._finish_whole()
        from mlx_lm.generate import TextStateMachine

        self._state, held, state = TextStateMachine.flush(self._state)
        if state == "tool":
            self._call_text += held
            return self._close_call(at_end=True)
        return [TextDelta(held)] if held else []

    # ------------------------------------------------------------ internals
    def _close_call(self, at_end: bool = False) -> list[Event]:
        text, self._call_text = self._call_text, ""
        try:
            parsed = self._fmt.parse(text, self._tools)
        except (ValueError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.dropped += 1
            return []
        return self._emit(parsed if isinstance(parsed, list) else [parsed])

    def _emit(self, parsed: list[Any]) -> list[Event]:
        events: list[Event] = []
        for call in parsed:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                self.dropped += 1
                continue
            arguments = call.get("arguments", {})
            text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            given = call.get("id")
            made = ToolCall(given if isinstance(given, str) and given else self._new_id(), call["name"], text)
            index = len(self.calls)
            self.calls.append(made)
            events += [
                ToolCallStart(index, made.id, made.name),
                ToolCallArguments(index, made.arguments),
                ToolCallEnd(index),
            ]
        return events

    def _feed_whole(self, text: str) -> list[Event]:
        if self._decided:
            if not self._is_call:
                return [TextDelta(text)]
            self._call_text += text
            return []
        self._head += text
        head = self._head.lstrip()
        if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
            return []  # cannot tell yet
        self._decided = True
        self._is_call = head.startswith("{") or head.startswith(PYTHON_TAG)
        if self._is_call:
            self._call_text = self._head
            return []
        return [TextDelta(self._head)]

    def _finish_whole(self) -> list[Event]:
        if not self._decided:
            return [TextDelta(self._head)] if self._head else []
        if not self._is_call:
            return []
        text, self._call_text = self._call_text, ""
        try:
            parsed = self._fmt.parse(text, self._tools)
        except ValueError:
            stripped = text.lstrip()
            if stripped.startswith(PYTHON_TAG) or stripped.replace(" ", "").startswith('{"name"'):
                self.dropped += 1  # a call cut short
                return []
            return [TextDelta(text)]  # JSON that is not a call: it was the answer
        return self._emit(parsed if isinstance(parsed, list) else [parsed])


@dataclass
class SplitAnswer:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    dropped: int = 0


def split_answer(fmt: ToolFormat, text: str, tools: Any = None, **kwargs: Any) -> SplitAnswer:
    """A whole answer: its text (calls removed) and its calls."""
    splitter = ToolCallSplitter(fmt, tools, **kwargs)
    events = splitter.feed(text) + splitter.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    return SplitAnswer(content, list(splitter.calls), splitter.dropped)


def finish_reason(engine_reason: str | None, calls: list[ToolCall]) -> str | None:
    """OpenAI's ``tool_calls`` when an answer that made calls ended by itself."""
    if engine_reason == "stop" and calls:
        return "tool_calls"
    return engine_reason


def _merge_text(events: list[Event]) -> list[Event]:
    merged: list[Event] = []
    for event in events:
        if isinstance(event, TextDelta) and merged and isinstance(merged[-1], TextDelta):
            merged[-1] = TextDelta(merged[-1].text + event.text)
        else:
            merged.append(event)
    return merged
