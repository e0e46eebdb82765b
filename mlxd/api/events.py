"""The one output stream every API surface adapts: what the engine produced,
as events per choice. Surfaces turn these into their JSON answer or their
stream frames; nothing else about generation is surface-specific."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxd.engine.types import GenerationChunk
from mlxd.tools.formats import ToolFormat
from mlxd.tools.splitter import TextDelta as SplitText
from mlxd.tools.splitter import ToolCallArguments, ToolCallSplitter, ToolCallStart, finish_reason


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens served from the prefix cache instead of prefilled.
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    choice: int
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call: the first names it, later ones add argument
    text. ``index`` counts the calls within one choice."""

    choice: int
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Logprobs:
    """Log-probabilities of the choice's next tokens
    (``mlxd.engine.logprobs.TokenLogprob``), only when the request asked."""

    choice: int
    entries: tuple[Any, ...]


@dataclass(frozen=True)
class Finish:
    """The choice is complete. ``reason``: "stop", "length" or "tool_calls";
    ``stop_sequence``: the request's stop string that ended it ("stop" only)."""

    choice: int
    reason: str
    usage: Usage
    stop_sequence: str | None = None


OutputEvent = TextDelta | ToolCallDelta | Logprobs | Finish


def chunk_events(choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
    """One engine chunk as events (an "abort" chunk is the caller's to handle)."""
    events: list[OutputEvent] = [TextDelta(choice, chunk.text)] if chunk.text else []
    for call in chunk.tool_calls or ():
        events.append(ToolCallDelta(choice, call.index, id=call.id, name=call.name, arguments=call.arguments))
    if chunk.logprobs:
        events.append(Logprobs(choice, tuple(chunk.logprobs)))
    if chunk.finish_reason:
        usage = Usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens)
        events.append(Finish(choice, chunk.finish_reason, usage, chunk.stop_sequence))
    return events


class ChoiceEvents:
    """Engine chunks as output events for every choice of one request, with
    tool calls split out of the text when the answer may hold them (the
    model's own call markup never reaches a client as text)."""

    def __init__(self, tool_format: ToolFormat | None = None, tools: Any = None) -> None:
        self._format = tool_format
        self._tools = tools
        self._splitters: dict[int, ToolCallSplitter] = {}

    def of(self, choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
        events = chunk_events(choice, chunk)
        if self._format is None:
            return events
        splitter = self._splitters.get(choice)
        if splitter is None:
            splitter = self._splitters[choice] = ToolCallSplitter(self._format, self._tools)
        out: list[OutputEvent] = []
        for event in events:
            if isinstance(event, TextDelta):
                out += _split_events(choice, splitter.feed(event.text))
            elif isinstance(event, Finish):
                out += _split_events(choice, splitter.finish())
                reason = finish_reason(event.reason, splitter.calls) or event.reason
                out.append(Finish(choice, reason, event.usage, event.stop_sequence if reason == "stop" else None))
            else:
                out.append(event)
        return out


def _split_events(choice: int, events: list[Any]) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    for event in events:
        if isinstance(event, SplitText):
            out.append(TextDelta(choice, event.text))
        elif isinstance(event, ToolCallStart):
            out.append(ToolCallDelta(choice, event.index, id=event.id, name=event.name))
        elif isinstance(event, ToolCallArguments):
            out.append(ToolCallDelta(choice, event.index, arguments=event.fragment))
        # ToolCallEnd: a call is whole once the next event or the finish comes.
    return out
