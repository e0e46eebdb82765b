"""The one internal conversation every API surface translates its request
into: roles, text and image parts, assistant tool calls and tool results.

A surface's adapter builds a ``Conversation``; planning, image checks and the
chat template only ever see this type. ``param`` on a part says where it
came from in the surface's own request body, so errors can name it there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class ImagePart:
    """An image, not read yet. ``url`` is a data:, file:// or http(s) URL (None
    when the part named none: a 400 once images are checked)."""

    url: str | None
    param: str


Part = TextPart | ImagePart


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made earlier in the conversation."""

    id: str
    name: str
    # JSON text, as the model wrote it.
    arguments: str
    # Where the arguments are in the surface's request body.
    param: str = "messages"


@dataclass(frozen=True)
class Message:
    role: Role
    # A plain string when the client sent one (templates treat the two
    # shapes differently), else the parts in order.
    content: str | tuple[Part, ...]
    # Assistant messages: the tools it called.
    tool_calls: tuple[ToolCall, ...] = ()
    # Tool messages: which call this is the result of.
    tool_call_id: str | None = None
    name: str | None = None
    # Assistant messages: the reasoning that came with the answer, for the
    # chat template to render or drop as its family does.
    reasoning: str = ""

    def parts(self) -> tuple[Part, ...]:
        return (TextPart(self.content),) if isinstance(self.content, str) else self.content

    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts() if isinstance(p, ImagePart))


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]

    def has_images(self) -> bool:
        return any(m.images() for m in self.messages)

    def text_length(self) -> int:
        """Characters of text, earlier reasoning and tool calls' arguments
        included (images not counted): a cheap bound on tokens."""
        text = sum(len(p.text) for m in self.messages for p in m.parts() if isinstance(p, TextPart))
        text += sum(len(m.reasoning) for m in self.messages)
        return text + sum(len(c.arguments) for m in self.messages for c in m.tool_calls)

    def template_messages(self) -> list[dict[str, Any]]:
        """The messages as chat templates take them. An image becomes
        ``{"type": "image"}``: the template only needs to know where it goes,
        and engines and logs need not carry its bytes."""
        return [_template_message(m) for m in self.messages]


@dataclass
class ToolTurn:
    """The calls of the assistant turn a tool result may answer, and which
    have been answered. OpenAI and Anthropic both refuse a result that
    answers no call of the turn before it: a template renders it as the
    result of nothing (a client that lost part of its history, or sent the
    wrong id), and the model answers a question nobody asked."""

    calls: tuple[str, ...] = ()
    # Where the calls were made, in the surface's own indexing.
    at: int = -1
    answered: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, messages: list[Message] | tuple[Message, ...], at: int) -> ToolTurn:
        return cls(tuple(c.id for m in messages for c in m.tool_calls), at)

    def answers(self, call_id: str | None) -> bool:
        """Whether a result for ``call_id`` answers one of these calls (and
        counts it answered)."""
        if call_id not in self.calls:
            return False
        self.answered.add(call_id)
        return True

    def unanswered(self) -> list[str]:
        return [c for c in self.calls if c not in self.answered]


# Deeper JSON than this in a tool's schema or a call's arguments is refused:
# no real tool nests so deep, and chat templates render such values
# recursively (transformers' own helpers hit Python's recursion limit at a
# few hundred levels, on the thread that tokenizes for every request).
MAX_NESTING = 100


def nesting_depth(value: Any) -> int:
    """How deep JSON-like ``value`` nests (a scalar is 0), without recursion."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            pending.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            pending.extend((v, depth + 1) for v in item)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def json_bytes(value: Any, limit: int) -> int:
    """About how many bytes JSON-like ``value`` takes as compact JSON
    (escapes aside), counting only until ``limit`` is passed: refusing
    megabytes costs a walk of the first ``limit`` bytes, not of them all."""
    total = 0
    pending = [value]
    while pending and total <= limit:
        item = pending.pop()
        if isinstance(item, str):
            total += 2 + (len(item) if item.isascii() else len(item.encode("utf-8", "surrogatepass")))
        elif isinstance(item, dict):
            total += 1 + 2 * len(item)  # the braces, each key's colon and comma
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            total += 1 + len(item)
            pending.extend(item)
        else:
            total += len(str(item))
    return total


def encodable(value: Any) -> bool:
    """Whether every string in JSON-like ``value`` is valid Unicode text. JSON
    may carry a lone surrogate (``"\\ud800"``), which no tokenizer encodes."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return True


def _template_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        out["content"] = message.content
    else:
        out["content"] = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
            for p in message.content
        ]
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.reasoning:
        # Qwen3-style templates read ``reasoning_content``, gpt-oss's ``thinking``.
        out["reasoning_content"] = out["thinking"] = message.reasoning
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> Any:
    # Chat templates render arguments with `tojson`: hand them the object,
    # or the text as it came when it is not JSON.
    try:
        return json.loads(text)
    except ValueError:
        return text
