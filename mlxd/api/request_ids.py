"""``X-Request-Id`` on every response: the client's own when it sent a
usable one, otherwise a fresh one. The cancel routes, the activity log and
captures find a request by it. The same id goes out as ``request-id`` too,
the header Anthropic sends and its SDKs read (``message._request_id``, an
error's ``request_id``). A plain ASGI middleware, outermost, so even a
request the guards refuse gets its id."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
# Anthropic's name for it.
ANTHROPIC_HEADER = b"request-id"
MAX_LENGTH = 128


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex[:24]


def usable(raw: bytes) -> str | None:
    """A client's id, if it is short printable ASCII without spaces (it is
    echoed back, logged and shown in a page)."""
    if not raw or len(raw) > MAX_LENGTH or not all(0x21 <= b <= 0x7E for b in raw):
        return None
    return raw.decode("ascii")


def id_headers(request_id: str) -> dict[str, str]:
    """The response headers that carry ``request_id``."""
    return {HEADER.decode(): request_id, ANTHROPIC_HEADER.decode(): request_id}


def request_id_of(scope: Scope) -> str:
    return scope.get("state", {}).get("request_id") or new_request_id()


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((value for name, value in scope["headers"] if name == HEADER), b"")
        request_id = usable(sent) or new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        headers = [(name.encode(), value.encode("ascii")) for name, value in id_headers(request_id).items()]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *headers]
            await send(message)

        await self.app(scope, receive, send_with_id)
