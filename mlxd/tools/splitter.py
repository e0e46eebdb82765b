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

Reasoning is split out first (``AnswerSplitter``): the text between a
family's think markers (``mlxd.tools.reasoning``), or gpt-oss's analysis
channel (``mlxd.tools.harmony``), comes out as ``ReasoningText``; only the
answer after it is searched for tool calls.

Pure: no MLX, no I/O; ``split_answer`` is the same thing for a whole answer.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

from mlxd.tools.formats import HARMONY, ToolFormat, format_named
from mlxd.tools.harmony import HarmonyChannels
from mlxd.tools.llama3 import PYTHON_TAG
from mlxd.tools.reasoning import ReasoningFormat


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningText:
    """Text the model wrote while reasoning (its markers left out)."""

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


Event = Union[TextDelta, ReasoningText, ToolCallStart, ToolCallArguments, ToolCallEnd]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id(prefix: str = "call_") -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


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
        return self.parsed_call(text)

    def parsed_call(self, text: str) -> list[Event]:
        """One call's text (what its markers enclose), parsed, as events;
        dropped and counted when the parser rejects it."""
        try:
            parsed = self._fmt.parse(text, self._tools)
        except (ValueError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.dropped += 1
            return []
        return self.add_calls(parsed if isinstance(parsed, list) else [parsed])

    def add_calls(self, parsed: list[Any]) -> list[Event]:
        """Calls in mlx-lm's parser shape (``{"name", "arguments"}``) as events."""
        events: list[Event] = []
        for call in parsed:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                self.dropped += 1
                continue
            arguments = call.get("arguments", {})
            text = arguments if isinstance(arguments, str) else arguments_json(arguments)
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
        return self.add_calls(parsed if isinstance(parsed, list) else [parsed])


class AnswerSplitter:
    """One answer's reasoning, text and tool calls, as it streams: the
    reasoning format splits reasoning from the answer, and the answer's
    text goes through a ``ToolCallSplitter`` when the model has a tool-call
    format. ``opens``: the prompt ended inside a reasoning block the
    template opened, so the answer starts as reasoning."""

    def __init__(
        self,
        tool_format: ToolFormat | None,
        tools: Any = None,
        reasoning: ReasoningFormat | None = None,
        *,
        opens: bool = False,
        new_id: Callable[[], str] = new_call_id,
    ) -> None:
        from mlx_lm.generate import TextStateMachine

        self._tools = ToolCallSplitter(tool_format, tools, new_id=new_id) if tool_format is not None else None
        self._harmony = HarmonyChannels() if reasoning is not None and reasoning.harmony else None
        # gpt-oss's calls are harmony messages: parsed here, whatever its tool format says.
        self._harmony_calls = ToolCallSplitter(format_named(HARMONY), tools, new_id=new_id) if self._harmony else None
        self._machine_state: Any = None
        if reasoning is not None and not reasoning.harmony:
            machine = TextStateMachine({
                "normal": [(reasoning.start, "reasoning")], "reasoning": [(reasoning.end, "normal")],
            })
            self._machine_state = machine.make_state("reasoning" if opens else "normal")

    @property
    def calls(self) -> list[ToolCall]:
        calls = self._harmony_calls or self._tools
        return calls.calls if calls is not None else []

    @property
    def dropped(self) -> int:
        calls = self._harmony_calls or self._tools
        return calls.dropped if calls is not None else 0

    @property
    def reasoning(self) -> bool:
        """Whether the answer is inside its reasoning now."""
        if self._harmony is not None:
            return self._harmony.reasoning
        return self._machine_state is not None and self._machine_state[0] == "reasoning"

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text))
        if self._machine_state is None:
            return self._answer(text)
        from mlx_lm.generate import TextStateMachine

        self._machine_state, pieces = TextStateMachine.split(self._machine_state, text)
        return self._pieces(pieces)

    def finish(self) -> list[Event]:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish())
        events: list[Event] = []
        if self._machine_state is not None:
            from mlx_lm.generate import TextStateMachine

            self._machine_state, held, state = TextStateMachine.flush(self._machine_state)
            events = self._pieces([(state, held)]) if held else []
        if self._tools is not None:
            events += self._tools.finish()
        return _merge_text(events)

    def _answer(self, text: str) -> list[Event]:
        if self._tools is None:
            return [TextDelta(text)] if text else []
        return self._tools.feed(text)

    def _pieces(self, pieces: list[tuple[str, str]]) -> list[Event]:
        events: list[Event] = []
        # (The blank lines a family writes after its end marker stay the
        # answer's, as mlx_lm.server and vLLM leave them.)
        for state, text in pieces:
            if text:
                events += [ReasoningText(text)] if state == "reasoning" else self._answer(text)
        return _merge_text(events)

    def _from_harmony(self, segments: list[tuple[str, ...]]) -> list[Event]:
        assert self._harmony_calls is not None
        events: list[Event] = []
        for segment in segments:
            if segment[0] == "reasoning":
                events.append(ReasoningText(segment[1]))
            elif segment[0] == "text":
                events.append(TextDelta(segment[1]))
            else:
                events += self._harmony_calls.parsed_call(f"{segment[1]}\n{segment[2]}")
        return _merge_text(events)


@dataclass
class SplitAnswer:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    dropped: int = 0
    reasoning: str = ""


def split_answer(
    fmt: ToolFormat | None, text: str, tools: Any = None, reasoning: ReasoningFormat | None = None,
    *, opens: bool = False, **kwargs: Any,
) -> SplitAnswer:
    """A whole answer: its text (reasoning and calls removed), its calls and its reasoning."""
    splitter = AnswerSplitter(fmt, tools, reasoning, opens=opens, **kwargs)
    events = splitter.feed(text) + splitter.finish()
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    thought = "".join(e.text for e in events if isinstance(e, ReasoningText))
    return SplitAnswer(content, list(splitter.calls), splitter.dropped, thought)


def finish_reason(engine_reason: str | None, calls: list[ToolCall]) -> str | None:
    """OpenAI's ``tool_calls`` when an answer that made calls ended by itself."""
    if engine_reason == "stop" and calls:
        return "tool_calls"
    return engine_reason


def _merge_text(events: list[Event]) -> list[Event]:
    merged: list[Event] = []
    for event in events:
        if isinstance(event, TextDelta | ReasoningText) and merged and type(merged[-1]) is type(event):
            merged[-1] = type(event)(merged[-1].text + event.text)  # type: ignore[union-attr]
        else:
            merged.append(event)
    return merged


def arguments_json(arguments: Any) -> str:
    """A call's parsed arguments as JSON text a client can parse. The parsers
    read the model's JSON with Python's json, which turns a number too large
    for a double (``1e999``, which a grammar-forced random model writes) into
    ``inf``, and ``json.dumps`` would write that back as ``Infinity``, which
    no JSON parser reads (JavaScript clients fail on the whole call). Such a
    number becomes the largest finite double, what JavaScript's own parser
    makes of it short of infinity; a NaN becomes null."""
    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None if math.isnan(value) else math.copysign(sys.float_info.max, value)
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v) for v in value]
        return value
    return json.dumps(finite(arguments), ensure_ascii=False, allow_nan=False)
