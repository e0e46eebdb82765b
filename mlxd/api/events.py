"""The one output stream every API surface adapts: what the engine produced,
as events per choice. Surfaces turn these into their JSON answer or their
stream frames; nothing else about generation is surface-specific."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from mlxd.engine.types import GenerationChunk
from mlxd.tools.formats import ToolFormat
from mlxd.tools.reasoning import ReasoningFormat
from mlxd.tools.splitter import (
    AnswerSplitter,
    ReasoningText,
    ToolCallArguments,
    ToolCallStart,
    finish_reason,
    new_call_id,
)
from mlxd.tools.splitter import TextDelta as SplitText


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens served from the prefix cache instead of prefilled.
    cached_tokens: int = 0
    # Completion tokens the model spent reasoning (part of completion_tokens).
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    choice: int
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Text of the model's reasoning (a thinking model's ``<think>`` block,
    gpt-oss's analysis channel), apart from the answer's text."""

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


OutputEvent = TextDelta | ReasoningDelta | ToolCallDelta | Logprobs | Finish


def chunk_events(choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
    """One engine chunk as events (an "abort" chunk is the caller's to handle)."""
    events: list[OutputEvent] = [ReasoningDelta(choice, chunk.reasoning)] if chunk.reasoning else []
    if chunk.text:
        events.append(TextDelta(choice, chunk.text))
    for call in chunk.tool_calls or ():
        events.append(ToolCallDelta(choice, call.index, id=call.id, name=call.name, arguments=call.arguments))
    if chunk.logprobs:
        events.append(Logprobs(choice, tuple(chunk.logprobs)))
    if chunk.finish_reason:
        usage = Usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens, chunk.reasoning_tokens or 0)
        events.append(Finish(choice, chunk.finish_reason, usage, chunk.stop_sequence))
    return events


class ChoiceEvents:
    """Engine chunks as output events for every choice of one request, with
    reasoning and tool calls split out of the text when the answer may hold
    them (the model's own markup never reaches a client as text), and the
    tokens spent reasoning counted. ``hide_reasoning``: the request asked
    for none of it in the answer (``reasoning.exclude``); it is still split
    off, so none leaks into the text, and still counted. ``one_call``: the
    request allowed no parallel calls (``parallel_tool_calls: false``,
    ``disable_parallel_tool_use: true``), so an answer holds its first call
    only, whatever the model (or a remote backend that ignores the flag)
    went on to write (a forced answer's grammar already allows one)."""

    def __init__(
        self, tool_format: ToolFormat | None = None, tools: Any = None, reasoning: ReasoningFormat | None = None,
        hide_reasoning: bool = False, one_call: bool = False, call_id_prefix: str = "call_",
    ) -> None:
        self._format = tool_format
        self._tools = tools
        self._reasoning = reasoning
        self._hide = hide_reasoning
        self._one_call = one_call
        self._new_id = functools.partial(new_call_id, call_id_prefix)
        self._choices: dict[int, _Choice] = {}

    def of(self, choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
        events = self._split(choice, chunk)
        return [e for e in events if not self._left_out(e)]

    def _left_out(self, event: OutputEvent) -> bool:
        if isinstance(event, ReasoningDelta):
            return self._hide
        return self._one_call and isinstance(event, ToolCallDelta) and event.index > 0

    def _split(self, choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
        events = chunk_events(choice, chunk)
        if self._format is None and self._reasoning is None and not chunk.reasoning:
            return events
        state = self._choices.get(choice)
        if state is None:
            # The first chunk says whether the prompt left a reasoning block open.
            splitter = AnswerSplitter(self._format, self._tools, self._reasoning, opens=chunk.opens_reasoning,
                                      new_id=self._new_id)
            state = self._choices[choice] = _Choice(splitter)
        return state.events(choice, chunk, events)


class _Choice:
    """One choice's splitter and its count of reasoning tokens, for an
    engine that does not count them itself: a chunk's tokens are reasoning
    when reasoning came out of it or it ended inside the reasoning (a
    marker held back)."""

    def __init__(self, splitter: AnswerSplitter) -> None:
        self.splitter = splitter
        self.reasoning_tokens = 0
        self._seen = 0
        # Whitespace after a tool call, held until text that is not whitespace
        # follows (then it goes out with it) or another call or the finish
        # comes (then it is dropped): the template's separator between
        # parallel calls reached clients as text ("\n" between the calls of
        # a stream, a message of "\n\n\n", a whitespace-only Responses item).
        self._called = False
        self._held = ""

    def events(self, choice: int, chunk: GenerationChunk, events: list[OutputEvent]) -> list[OutputEvent]:
        splitter = self.splitter
        was_reasoning = splitter.reasoning
        out: list[OutputEvent] = []
        for event in events:
            if isinstance(event, TextDelta):
                out += _split_events(choice, splitter.feed(event.text))
            elif isinstance(event, Finish):
                out += _split_events(choice, splitter.finish())  # the Finish itself comes last, below
            else:
                out.append(event)
        spent = max(0, chunk.completion_tokens - self._seen)
        self._seen = max(self._seen, chunk.completion_tokens)
        if was_reasoning or splitter.reasoning or any(isinstance(e, ReasoningDelta) for e in out):
            self.reasoning_tokens += spent
        for event in events:
            if isinstance(event, Finish):
                reason = finish_reason(event.reason, splitter.calls) or event.reason
                # The engine's own count (token by token) when it kept one.
                counted = chunk.reasoning_tokens
                reasoning = counted if counted is not None else self.reasoning_tokens
                usage = Usage(event.usage.prompt_tokens, event.usage.completion_tokens, event.usage.cached_tokens,
                              min(reasoning, event.usage.completion_tokens))
                out.append(Finish(choice, reason, usage, event.stop_sequence if reason == "stop" else None))
        return self._between_calls(out)

    def _between_calls(self, events: list[OutputEvent]) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        for event in events:
            if isinstance(event, TextDelta) and self._called:
                if not event.text.strip():
                    self._held += event.text
                    continue
                event, self._held = TextDelta(event.choice, self._held + event.text), ""
            elif isinstance(event, (ToolCallDelta, Finish)):
                self._called, self._held = self._called or isinstance(event, ToolCallDelta), ""
            out.append(event)
        return out


def _split_events(choice: int, events: list[Any]) -> list[OutputEvent]:
    out: list[OutputEvent] = []
    for event in events:
        if isinstance(event, SplitText):
            out.append(TextDelta(choice, event.text))
        elif isinstance(event, ReasoningText):
            out.append(ReasoningDelta(choice, event.text))
        elif isinstance(event, ToolCallStart):
            out.append(ToolCallDelta(choice, event.index, id=event.id, name=event.name))
        elif isinstance(event, ToolCallArguments):
            out.append(ToolCallDelta(choice, event.index, arguments=event.fragment))
        # ToolCallEnd: a call is whole once the next event or the finish comes.
    return out
