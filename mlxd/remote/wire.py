"""The OpenAI wire form of a remote request, as pure functions: an engine
request -> the upstream JSON body, upstream stream events -> engine chunks,
an upstream error answer -> a typed error. No I/O here (``remote.engine``
does the talking), so every translation is a plain unit test."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine.types import GenerationChunk, GenerationRequest, SamplingParams, ToolCallFragment
from mlxd.errors import BackendFailed, BadRequest, MlxdError, UpstreamRejected

# Sampling fields outside OpenAI's own set: servers that do not know them
# (OpenAI itself) reject them, so they go out only when they change something.
_EXTENSIONS_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def endpoint(request: GenerationRequest) -> str:
    return "/chat/completions" if request.messages is not None else "/completions"


def request_body(request: GenerationRequest, remote_model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": remote_model,
        "max_tokens": request.max_tokens,
        "stream": True,
        # Usage comes back in the last chunk only when asked for.
        "stream_options": {"include_usage": True},
        **_sampling(request.sampling, request.sampling_set),
    }
    if request.messages is not None:
        body["messages"] = _wire_messages(request.messages, request.images)
    else:
        body["prompt"] = request.prompt or ""
    if request.stop:
        body["stop"] = list(request.stop)
    # The answer's shape, as the client asked for it: the backend applies
    # its own tool-call format and grammar.
    for name in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.ignore_eos:
        body["ignore_eos"] = True  # vLLM and mlxd know it; a benchmark setting
    if request.logit_bias:
        # The ids are the backend model's: it checks them against its vocabulary.
        body["logit_bias"] = {str(token): bias for token, bias in request.logit_bias.items()}
    return body


def _sampling(s: SamplingParams, given: frozenset[str]) -> dict[str, Any]:
    """What the request or the entry's defaults said; the backend applies
    its own defaults (an mlxd backend: its model's) to the rest."""
    out: dict[str, Any] = {}
    for name in sorted(given):
        value = getattr(s, name)
        if name in _EXTENSIONS_NEUTRAL and value == _EXTENSIONS_NEUTRAL[name]:
            continue
        if value is not None:
            out[name] = value
    return out


def _wire_messages(messages: list[dict[str, Any]], images: list[Any]) -> list[dict[str, Any]]:
    """Template messages in OpenAI's wire form: each ``{"type": "image"}``
    placeholder becomes the image itself (``images``: data URLs, in message
    order), and tool-call arguments go back to JSON text (templates take
    them as objects, rendered with ``tojson``)."""
    pending = iter(images)
    return [_wire_message(m, pending) for m in messages]


def _wire_message(message: dict[str, Any], images: Any) -> dict[str, Any]:
    out = message
    content = message.get("content")
    if isinstance(content, list) and any(p.get("type") == "image" for p in content):
        parts = [{"type": "image_url", "image_url": {"url": _next_image(images)}} if p.get("type") == "image" else p
                 for p in content]
        out = {**out, "content": parts}
    calls = message.get("tool_calls")
    if calls:
        wired = []
        for call in calls:
            function = dict(call.get("function") or {})
            if not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments"))
            wired.append({**call, "function": function})
        out = {**out, "tool_calls": wired}
    return out


def _next_image(images: Any) -> str:
    url = next(images, None)
    if url is None:  # a placeholder without its image: nothing to send for it
        raise BadRequest("An image part of the conversation has no image data.", param="messages")
    return url


# --- the answer ---------------------------------------------------------------


@dataclass
class StreamReader:
    """Reads one upstream event stream as its bytes arrive. All the output of
    the complete events in one read goes out as one chunk: when the front
    falls behind, the backend's tokens pile up in the socket, and relaying
    them as one frame costs one write instead of one per token. The finish
    is held back until the stream ends, because the usage that belongs in
    it comes in an event of its own after it."""

    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    done: bool = False
    # Tool calls seen so far, by index: whether their name has gone out.
    _calls: dict[int, bool] = field(default_factory=dict)
    # The start of an event line whose end has not arrived yet.
    _partial: bytes = b""

    def feed(self, data: bytes) -> GenerationChunk | None:
        """Bytes as they arrived (several events, or part of one); a chunk
        when the complete events among them carry new output."""
        *lines, self._partial = (self._partial + data).split(b"\n")
        text = ""
        calls: list[ToolCallFragment] = []
        for line in lines:
            # Comments (heartbeats), event names and blank separators carry nothing.
            if self.done or not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                continue
            piece, more = self._event(_json_object(payload))
            text += piece
            calls += more
        if not text and not calls:
            return None
        return GenerationChunk(text=text, completion_tokens=self.completion_tokens, tool_calls=calls or None)

    def whole(self, payload: dict[str, Any]) -> GenerationChunk | None:
        """A whole answer's JSON, which reads like one event with ``message``
        where a stream has ``delta``."""
        text, calls = self._event(payload)
        if not text and not calls:
            return None
        return GenerationChunk(text=text, completion_tokens=self.completion_tokens, tool_calls=calls or None)

    def _event(self, payload: dict[str, Any]) -> tuple[str, list[ToolCallFragment]]:
        if "error" in payload:
            raise upstream_stream_error(payload)
        self._usage(payload.get("usage"))
        text = ""
        calls: list[ToolCallFragment] = []
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta", choice.get("message"))
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                text += piece
            if isinstance(delta, dict) and delta.get("tool_calls"):
                calls += self._tool_calls(delta["tool_calls"])
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return text, calls

    def _tool_calls(self, calls: Any) -> list[ToolCallFragment]:
        out = []
        for position, call in enumerate(calls if isinstance(calls, list) else []):
            if not isinstance(call, dict):
                continue
            index = call.get("index")
            # A whole answer's calls carry no index: their order is it.
            index = index if isinstance(index, int) else position
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = json.dumps(arguments)  # some servers send an object
            call_id = call.get("id") if isinstance(call.get("id"), str) else None
            name = function.get("name") if isinstance(function.get("name"), str) else None
            # Some servers repeat the id and name on every piece: each goes
            # out once, the id with the call's first piece.
            if index not in self._calls:
                self._calls[index] = False
                call_id = call_id or f"call_{uuid.uuid4().hex[:24]}"
            else:
                call_id = None
            if name is not None and not self._calls[index]:
                self._calls[index] = True
            else:
                name = None
            out.append(ToolCallFragment(index, call_id, name, arguments or ""))
        return out

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            self.cached_tokens = int(details.get("cached_tokens") or 0)

    def finish(self) -> GenerationChunk:
        """The closing chunk; a stream that ended without saying how is a
        backend that died mid-answer."""
        if self.finish_reason is None:
            raise BackendFailed("The backend closed the stream before the answer was finished")
        return GenerationChunk(
            text="",
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )


def whole_answer(body: bytes) -> list[GenerationChunk]:
    """A backend that answered with one JSON document though a stream was
    asked for: its text and tool calls as one chunk, then the finish."""
    reader = StreamReader()
    chunk = reader.whole(_json_object(body))
    return [*([chunk] if chunk is not None else []), reader.finish()]


def _json_object(data: str | bytes) -> dict[str, Any]:
    try:
        payload = json.loads(data)
    except ValueError:
        raise BackendFailed("The backend sent an answer that is not JSON") from None
    if not isinstance(payload, dict):
        raise BackendFailed("The backend sent an answer that is not a JSON object")
    return payload


def _error_fields(payload: Any) -> dict[str, Any]:
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    if isinstance(payload, dict) and isinstance(payload.get("detail"), str):
        return {"message": payload["detail"]}
    return {}


def upstream_error(backend: str, status: int, body: bytes, retry_after: str | None) -> MlxdError:
    """The typed error for an upstream answer with an error status."""
    try:
        fields = _error_fields(json.loads(body))
    except ValueError:
        fields = {}
    message = str(fields.get("message") or "").strip()[:500]
    retry = _seconds(retry_after)
    if status in (401, 403):
        # The client's key was fine (the front checked it); the front's key
        # for the backend is not, which is the operator's to fix.
        return BackendFailed(
            f"Backend `{backend}` refused mlxd's credentials ({status}); check its api_key_env"
        )
    if 400 <= status < 500:
        return UpstreamRejected(
            status,
            message or f"Backend `{backend}` rejected the request ({status})",
            error_type=str(fields.get("type") or "invalid_request_error"),
            param=fields.get("param") if isinstance(fields.get("param"), str) else None,
            code=fields.get("code") if isinstance(fields.get("code"), str) else None,
            retry_after=retry,
        )
    detail = f": {message}" if message else ""
    return BackendFailed(f"Backend `{backend}` failed ({status}){detail}", retry_after=retry or 5)


def upstream_stream_error(payload: dict[str, Any]) -> BackendFailed:
    message = str(_error_fields(payload).get("message") or "the backend reported an error").strip()[:500]
    return BackendFailed(f"The backend failed mid-answer: {message}")


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
