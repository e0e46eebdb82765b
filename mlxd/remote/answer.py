"""Reading a remote backend's answer, as pure functions: its event stream
(SSE, as the bytes arrive) or its whole JSON document -> engine chunks,
within bounds no real backend comes near."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine.types import GenerationChunk, ToolCallFragment
from mlxd.errors import BackendFailed, clip
from mlxd.remote.refusals import broken, upstream_stream_error

# What one backend may make the front hold: an event (or a whole JSON answer)
# larger than any real one is a broken or hostile backend, not a long answer.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# Distinct tool calls in one answer: a backend's index is a label, never a
# count of calls to make room for.
MAX_TOOL_CALLS = 128
# The largest usage count believed; beyond it a figure is noise (and would
# not fit prometheus' floats exactly).
_MAX_COUNT = 10**15
_FINISH_LIMIT = 40


@dataclass
class _Call:
    """One of the backend's tool calls: its local index once named (the
    next free one: indices are dense and in order of naming), and what
    arrived for it before its name did."""

    local: int | None = None
    held_id: str | None = None
    held: list[str] = field(default_factory=list)
    held_bytes: int = 0


@dataclass
class StreamReader:
    """Reads one upstream event stream as its bytes arrive (SSE: lines end
    at LF, CRLF or CR; an event is its ``data:`` lines joined by LF, up to a
    blank line). All the output of the complete events in one read goes out
    as one chunk: when the front falls behind, the backend's tokens pile up
    in the socket, and relaying them as one frame costs one write instead of
    one per token. The finish is held back until the stream ends, because
    the usage that belongs in it comes in an event of its own after it.

    A line still arriving is kept as its pieces and only the new bytes of a
    read are scanned, so a long line costs its length, not its length
    squared; an event over ``MAX_EVENT_BYTES`` is refused."""

    backend: str = ""
    # A /v1/completions answer: tool calls are a chat affair, ignored there.
    chat: bool = True
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int | None = None
    # Reasoning the backend split out, not yet handed on in a chunk.
    _reasoning: list[str] = field(default_factory=list)
    done: bool = False
    # Complete data events read (the first one is the backend's acceptance).
    events: int = 0
    _calls: dict[int, _Call] = field(default_factory=dict)
    _named: int = 0
    # The pieces of the line still arriving, and their size.
    _line: list[bytes] = field(default_factory=list)
    _line_bytes: int = 0
    # The data lines of the event still arriving, and their size.
    _data: list[bytes] = field(default_factory=list)
    _data_bytes: int = 0
    # The last read ended in CR: an LF that starts the next one ends no line.
    _after_cr: bool = False

    def feed(self, data: bytes) -> GenerationChunk | None:
        """Bytes as they arrived (several events, or part of one); a chunk
        when the complete events among them carry new output."""
        if self._after_cr and data:
            self._after_cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\r" in data:
            self._after_cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        rest = lines.pop()
        text = ""
        calls: list[ToolCallFragment] = []
        if lines and self._line:
            self._line.append(lines[0])
            lines[0] = b"".join(self._line)
            self._line.clear()
            self._line_bytes = 0
        for line in lines:
            if line.startswith(b"data:"):
                value = line[6:] if line[5:6] == b" " else line[5:]
                self._data.append(value)
                self._data_bytes += len(value)
                if self._data_bytes > MAX_EVENT_BYTES:
                    raise self._too_large()
            elif not line and self._data:
                piece, more = self._dispatch()
                text += piece
                calls += more
            # Comments (heartbeats), event names, ids: nothing to relay.
        if rest:
            self._line.append(rest)
            self._line_bytes += len(rest)
            if self._line_bytes + self._data_bytes > MAX_EVENT_BYTES:
                raise self._too_large()
        return self._chunk(text, calls)

    def _chunk(self, text: str, calls: list[ToolCallFragment]) -> GenerationChunk | None:
        """What the events read so far hand on (None: nothing)."""
        reasoning = "".join(self._reasoning)
        self._reasoning.clear()
        if not text and not calls and not reasoning:
            return None
        return GenerationChunk(text=text, completion_tokens=self.completion_tokens, tool_calls=calls or None,
                               reasoning=reasoning)

    def close(self) -> GenerationChunk | None:
        """The stream ended cleanly: a last event that no blank line (or no
        newline at all) followed is complete all the same."""
        self._after_cr = False
        return self.feed(b"\n\n") if self._line or self._data else None

    def _too_large(self) -> BackendFailed:
        return broken(self.backend, f"sent an event larger than {MAX_EVENT_BYTES // (1024 * 1024)} MiB")

    def _dispatch(self) -> tuple[str, list[ToolCallFragment]]:
        payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        self._data.clear()
        self._data_bytes = 0
        if self.done:
            return "", []  # nothing counts after [DONE]
        if len(payload) < 16:
            payload = payload.strip()
            if payload == b"[DONE]":
                self.events += 1
                self.done = True
                return "", []
            if not payload:
                return "", []  # an empty event carries nothing
        self.events += 1
        return self._event(_json_object(payload, self.backend))

    def whole(self, payload: dict[str, Any]) -> GenerationChunk | None:
        """A whole answer's JSON, which reads like one event with ``message``
        where a stream has ``delta``."""
        self.events += 1
        text, calls = self._event(payload)
        return self._chunk(text, calls)

    def _event(self, payload: dict[str, Any]) -> tuple[str, list[ToolCallFragment]]:
        if payload.get("error") is not None:
            raise upstream_stream_error(payload, self.backend)
        self._usage(payload.get("usage"))
        choices = payload.get("choices")
        if choices is None:
            return "", []
        if not isinstance(choices, list):
            raise broken(self.backend, "sent `choices` that is not a list")
        text = ""
        calls: list[ToolCallFragment] = []
        for choice in choices:
            if not isinstance(choice, dict):
                raise broken(self.backend, "sent a choice that is not an object")
            # mlxd asks for one choice: another index is not this answer's.
            if choice.get("index") not in (None, 0):
                continue
            delta = choice.get("delta", choice.get("message"))
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                text += piece
            if self.chat and isinstance(delta, dict):
                # vLLM, DeepSeek and mlxd say reasoning_content; mlx_lm.server and OpenRouter, reasoning.
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(thought, str):
                    self._reasoning.append(thought)
            if self.chat and isinstance(delta, dict) and delta.get("tool_calls"):
                calls += self._tool_calls(delta["tool_calls"])
            self._finish(choice.get("finish_reason"))
        return text, calls

    def _finish(self, reason: Any) -> None:
        if not reason:
            return
        if not isinstance(reason, str):
            # It did say the answer is over; how is not readable.
            self.finish_reason = "stop"
        elif reason == "abort":
            # The front's own word for a preempted local generation (a 503);
            # a backend that aborted its answer has failed it.
            raise broken(self.backend, "aborted the answer")
        else:
            self.finish_reason = clip(reason, _FINISH_LIMIT)

    def _tool_calls(self, calls: Any) -> list[ToolCallFragment]:
        out = []
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            # A whole answer's calls carry no index: their order is it.
            key = index if isinstance(index, int) and not isinstance(index, bool) else position
            state = self._calls.get(key)
            if state is None:
                if len(self._calls) >= MAX_TOOL_CALLS:
                    raise broken(self.backend, f"sent more than {MAX_TOOL_CALLS} tool calls in one answer")
                state = self._calls[key] = _Call()
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = json.dumps(arguments)  # some servers send an object
            call_id = call.get("id") if isinstance(call.get("id"), str) else None
            name = function.get("name") if isinstance(function.get("name"), str) and function["name"] else None
            if state.local is not None:
                # Some servers repeat the id and name on every piece: each
                # went out once, with the call's first piece.
                if arguments:
                    out.append(ToolCallFragment(state.local, None, None, arguments))
                continue
            state.held_id = state.held_id or call_id
            if arguments:
                state.held.append(arguments)
                state.held_bytes += len(arguments)
                if state.held_bytes > MAX_EVENT_BYTES:
                    raise self._too_large()
            if name is None:
                # A call goes out only once it is named: no surface can open
                # a call without a name, and one that never gets one is none.
                continue
            state.local = self._named
            self._named += 1
            held = "".join(state.held)
            state.held.clear()
            out.append(ToolCallFragment(state.local, state.held_id or f"call_{uuid.uuid4().hex[:24]}", name, held))
        return out

    def _usage(self, usage: Any) -> None:
        # A backend's accounting is not worth failing its answer over: a
        # figure that is not a count counts as 0.
        if not isinstance(usage, dict):
            return
        self.prompt_tokens = _count(usage.get("prompt_tokens"))
        self.completion_tokens = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = _count(details.get("cached_tokens"))
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            self.reasoning_tokens = _count(details.get("reasoning_tokens"))

    def finish(self) -> GenerationChunk:
        """The closing chunk; a stream that ended without saying how is a
        backend that died mid-answer."""
        if self.finish_reason is None:
            raise broken(self.backend, "closed the stream before the answer was finished")
        return GenerationChunk(
            text="",
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            reasoning_tokens=self.reasoning_tokens,
        )


def _count(value: Any) -> int:
    """A usage figure: a non-negative int or a string of digits; anything
    else (text, lists, negatives, floats, NaN) is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value if 0 <= value <= _MAX_COUNT else 0
    if isinstance(value, str) and 0 < len(value) <= 15 and value.isascii() and value.isdigit():
        return int(value)
    return 0


def whole_answer(body: bytes, backend: str = "", *, chat: bool = True) -> list[GenerationChunk]:
    """A backend that answered with one JSON document though a stream was
    asked for: its text and tool calls as one chunk, then the finish."""
    reader = StreamReader(backend, chat=chat)
    chunk = reader.whole(_json_object(body, backend))
    return [*([chunk] if chunk is not None else []), reader.finish()]


def _json_object(data: str | bytes, backend: str = "") -> dict[str, Any]:
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):  # (nesting deep enough to exhaust the stack)
        raise broken(backend, "sent an answer that is not JSON") from None
    if not isinstance(payload, dict):
        raise broken(backend, "sent an answer that is not a JSON object")
    return payload
