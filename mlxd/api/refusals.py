"""An activity-log row for a generation or speech request refused before
it was planned: a bad key, a foreign Host or Origin, a body too large, slow
or invalid, an unknown model, a bad upload, a limit. A planned request
writes its own row when it ends (``api.accounting``, ``api.audio.path``);
these never reach that point, and an operator asking "why did my agent's
turn fail?" must find them too. A refusal whose caller is known counts in
its usage (an error, no tokens), as a planned request does.

A plain ASGI middleware just inside ``RequestIds`` (the row carries the id)
and outside every guard. It keeps references to the body chunks the app
reads (its first MiB), not copies, and forgets them as soon as the answer
is a success; a
request the gatekeeper refused has read no body, so its row names no model.
Each refusal is also a sample of ``mlxd_requests_total`` and
``mlxd_app_refusals_total`` and one request log line: a storm of 429s or
401s used to show in neither /metrics nor the log.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxd.api.embeddings import paths as embedding_paths
from mlxd.api.request_ids import request_id_of
from mlxd.monitoring.activity import NO_CALLER, ActivityLog, ActivityRow, Counted
from mlxd.monitoring.usage import UsageBook, one_request

if TYPE_CHECKING:
    from mlxd.monitoring.metrics import Metrics

log = logging.getLogger("mlxd.requests")

# The paths whose requests the activity log keeps, and their surfaces.
SURFACES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/v1/audio/transcriptions": "transcription",
    "/v1/audio/translations": "translation",
    "/v1/audio/speech": "speech",
}
# Requests counted in usage only (the activity log keeps generation requests).
USAGE_ONLY = embedding_paths.PATHS
# Set in the scope's state by a request that will write its own row (and count its own usage).
ACCOUNTED = "accounted"
# What a refused request that named no model the registry has is counted under.
UNKNOWN_MODEL = "(unknown)"
# Enough of an error body for its message; enough of a request body to parse.
MAX_ERROR_BYTES = 16 * 1024
MAX_PARSED_BYTES = 1024 * 1024
_MODEL = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.){0,256}")')
# The same two fields of a multipart form (the transcription routes).
_FORM_FIELD = re.compile(rb'name="(model|stream)"\r\n(?:[^\r\n]*\r\n)*?\r\n([^\r\n]{0,256})\r\n')


class RefusalLog:
    """Also counts each refused request in its app's usage, where the app is
    known (a refused key has none), in memory and in the activity log's
    usage table, as a finished request is."""

    def __init__(self, app: ASGIApp, activity: ActivityLog | None, usage: UsageBook | None,
                 entry_name: Callable[[str], str | None], metrics: Metrics | None = None) -> None:
        """``entry_name``: the registry entry a name a client wrote resolves
        to (an alias, a glob), or None; read at each refusal, so a reload
        counts."""
        self.app = app
        self.activity = activity
        self.usage = usage
        self.entry_name = entry_name
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        post = scope["type"] == "http" and scope["method"] == "POST"
        surface = SURFACES.get(scope["path"]) if post else None
        if post and surface is None and scope["path"] in USAGE_ONLY:
            surface = ""
        if surface is None:
            await self.app(scope, receive, send)
            return
        started, seen = time.monotonic(), _Seen()

        async def reading() -> Message:
            message = await receive()
            if message["type"] == "http.request" and seen.body is not None and seen.kept < MAX_PARSED_BYTES:
                chunk = message.get("body", b"")
                seen.body.append(chunk[: MAX_PARSED_BYTES - seen.kept] if seen.kept + len(chunk) > MAX_PARSED_BYTES
                                 else chunk)
                seen.kept += len(chunk)
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen.status = message["status"]
                if seen.status < 400:
                    seen.body = None  # an answer: its own row is written elsewhere
            elif message["type"] == "http.response.body" and seen.status >= 400 and seen.size < MAX_ERROR_BYTES:
                chunk = message.get("body", b"")[: MAX_ERROR_BYTES - seen.size]
                seen.error.append(chunk)
                seen.size += len(chunk)
            await send(message)

        try:
            await self.app(scope, reading, sending)
        finally:
            if seen.status >= 400 and not scope.get("state", {}).get(ACCOUNTED):
                self._refused(scope, surface, seen, time.monotonic() - started)

    def _refused(self, scope: Scope, surface: str, seen: _Seen, seconds: float) -> None:
        row = _row(scope, surface, seen, seconds)
        # Counted under the entry, as a planned request is; a name no entry
        # answers to (the refusal's message still says it) under one row, so
        # a client making up names cannot grow the usage tables without end.
        asked = row.model
        model = (self.entry_name(asked) or UNKNOWN_MODEL) if asked else ""
        row = replace(row, model=model, target=model)
        if self.usage is not None and row.key != NO_CALLER:
            self.usage.add(row.key, row.model, one_request(row.status))
        if self.activity is not None:
            self.activity.add(row if surface else Counted(row.key, row.model, row.status))
        if self.metrics is not None:
            self.metrics.requests.labels(row.model, str(row.status)).inc()
            self.metrics.app_refusals.labels(row.key, str(row.status)).inc()
        # The client's name for the model is in the message (repr: it may hold anything).
        log.info("%s refused model=%s caller=%s status=%d seconds=%.3f request_id=%s error=%r",
                 surface or scope["path"], row.model or "-", row.key, row.status, seconds, row.request_id,
                 (row.error or "")[:300])


class _Seen:
    def __init__(self) -> None:
        self.status = 0
        self.body: list[bytes] | None = []
        self.kept = 0
        self.error: list[bytes] = []
        self.size = 0


def _row(scope: Scope, surface: str, seen: _Seen, seconds: float) -> ActivityRow:
    model, stream = _asked(b"".join(seen.body or ()))
    caller = scope.get("state", {}).get("caller")
    return ActivityRow(
        time=time.time(), request_id=request_id_of(scope), response_id="",
        # No caller: the key itself was refused (or never checked).
        key=caller.name if caller is not None else NO_CALLER,
        model=model, target=model, surface=surface, stream=stream, status=seen.status,
        tokens_in=0, tokens_cached=0, tokens_out=0, ttft_seconds=None, tokens_per_second=None,
        duration_seconds=round(seconds, 4), finish_reason=None, error=_message(b"".join(seen.error)),
    )


def _asked(body: bytes) -> tuple[str, bool]:
    """The model and ``stream`` the body asked for, as far as it can be read."""
    if body.startswith(b"--"):  # multipart: its form fields (before the file, as clients send them)
        form = {name: value for name, value in _FORM_FIELD.findall(body)}
        return form.get(b"model", b"").decode("utf-8", "replace"), form.get(b"stream", b"").lower() == b"true"
    if len(body) < MAX_PARSED_BYTES:  # (else cut short: only its head is kept)
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            model = parsed.get("model")
            return (model[:256] if isinstance(model, str) else ""), parsed.get("stream") is True
    found = _MODEL.search(body)
    if found is None:
        return "", False
    try:
        return str(json.loads(found.group(1))), False
    except ValueError:
        return "", False


def _message(body: bytes) -> str | None:
    """The error's message, in either surface's shape (``error.message``)."""
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")[:500] or None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return None
