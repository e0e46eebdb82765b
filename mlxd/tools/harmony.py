"""gpt-oss's harmony format, parsed from the text its tokenizer decodes.

An answer is a run of messages, each ``header<|message|>body`` closed by
``<|end|>`` (more follows), ``<|call|>`` (a tool call) or ``<|return|>``
(the last), the next opened by ``<|start|>``. The header names the channel
and, for a tool call, the recipient::

    <|channel|>analysis<|message|>The user wants...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

``analysis`` is reasoning, ``final`` (and ``commentary`` without a
recipient: a preamble the user may see) is the answer, a message to
``functions.NAME`` is a call of NAME. The generation prompt ends in
``<|start|>assistant``, so an answer starts in a header.

This replaces ``openai-harmony``'s parser, which fetches its vocabulary
from the network on first use: here only the model's own special tokens,
as its detokenizer writes them, are read. ``<|call|>`` and ``<|return|>``
end the generation (they are end tokens, so they never reach the text):
the body still open when the answer ends is closed by that end.

Pure: no MLX, no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
START = "<|start|>"
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
FUNCTIONS = "functions."

# One piece of parsed output: ("reasoning", text), ("text", text), or
# ("call", name, arguments) once a call's message is whole.
Segment = tuple[str, ...]


class HarmonyChannels:
    """One answer's harmony messages as they stream: ``feed`` decoded text,
    then ``finish`` once."""

    def __init__(self) -> None:
        from mlx_lm.generate import TextStateMachine

        machine = TextStateMachine({
            "header": [(MESSAGE, "body")],
            "body": [(end, "between") for end in ENDS],
            "between": [(START, "header")],
        })
        self._state = machine.make_state("header")
        self._header = ""
        self._route: tuple[str, str] = ("text", "")
        self._body = ""
        # The state the last piece of text was in.
        self._previous = "header"

    @property
    def reasoning(self) -> bool:
        """Whether the answer is in an analysis message now."""
        return self._state[0] == "body" and self._route[0] == "reasoning"

    def feed(self, text: str) -> list[Segment]:
        from mlx_lm.generate import TextStateMachine

        if not text:
            return []
        self._state, pieces = TextStateMachine.split(self._state, text)
        return self._segments(pieces)

    def finish(self) -> list[Segment]:
        from mlx_lm.generate import TextStateMachine

        self._state, held, state = TextStateMachine.flush(self._state)
        out = self._segments([(state, held)]) if held else []
        if state == "body":
            out += self._close()
        elif state == "header" and self._header.strip():
            # Text that never became a message: a model not writing harmony.
            out.append(("text", self._header))
            self._header = ""
        return out

    def _segments(self, pieces: list[tuple[str, str]]) -> list[Segment]:
        out: list[Segment] = []
        previous = self._previous
        for state, text in pieces:
            if previous == "header" and state != "header":
                self._route = route(self._header)
                self._header = ""
            elif previous == "body" and state != "body":
                out += self._close()
            if state == "header":
                self._header += text
            elif state == "body" and text:
                if self._route[0] == "call":
                    self._body += text
                else:
                    out.append((self._route[0], text))
            elif state == "between" and text.strip():
                out.append(("text", text))
            previous = state
        self._previous = previous
        return _merged(out)

    def _close(self) -> list[Segment]:
        kind, name = self._route
        self._route = ("text", "")
        if kind != "call":
            return []
        body, self._body = self._body, ""
        return [("call", name, body)]


def route(header: str) -> tuple[str, str]:
    """Where a message's body goes, from its header: ("reasoning", ""),
    ("text", "") or ("call", tool name)."""
    recipient = _RECIPIENT.search(header)
    if recipient is not None:
        name = recipient.group(1)
        return "call", name[len(FUNCTIONS):] if name.startswith(FUNCTIONS) else name
    channel = _CHANNEL.search(header)
    if channel is not None and channel.group(1) == "analysis":
        return "reasoning", ""
    return "text", ""


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any]:
    """A call as ``HarmonyChannels`` gives it (``name`` and the message
    body, JSON arguments) in mlx-lm's parser shape; ValueError when the
    body is not a JSON object."""
    name, _, body = text.partition("\n")
    arguments = json.loads(body) if body.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError("harmony call arguments are not a JSON object")
    return {"name": name, "arguments": arguments}


def _merged(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for segment in segments:
        if out and segment[0] != "call" and out[-1][0] == segment[0]:
            out[-1] = (segment[0], out[-1][1] + segment[1])
        else:
            out.append(segment)
    return out
