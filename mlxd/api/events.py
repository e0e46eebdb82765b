"""The one output stream every API surface adapts: what the engine produced,
as events per choice. Surfaces turn these into their JSON answer or their
stream frames; nothing else about generation is surface-specific."""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.engine.types import GenerationChunk


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
class Finish:
    """The choice is complete. ``reason``: "stop", "length" or "tool_calls"."""

    choice: int
    reason: str
    usage: Usage


OutputEvent = TextDelta | ToolCallDelta | Finish


def chunk_events(choice: int, chunk: GenerationChunk) -> list[OutputEvent]:
    """One engine chunk as events (an "abort" chunk is the caller's to handle)."""
    events: list[OutputEvent] = [TextDelta(choice, chunk.text)] if chunk.text else []
    if chunk.finish_reason:
        usage = Usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens)
        events.append(Finish(choice, chunk.finish_reason, usage))
    return events
