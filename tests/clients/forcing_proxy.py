"""A proxy in front of the demo daemon that makes a random-weight model call
a client's file-reading tool once, for the clients that have no setting for
``tool_choice`` of their own (OpenCode, Qwen Code, Continue CLI, llm; pi has
an extension hook, and its test uses that).

The first chat request that carries the named tool on the user's turn gets
a ``tool_choice`` naming it, and that tool's one required parameter
narrowed (in what mlxd sees, not in what the client validates against) to
one real file: an ``enum``, which mlxd's grammar enforces, so even a random
model writes exactly that path and closes the call. Every other request,
the follow-up with the tool's result included, goes through unchanged, so
the model's own answer ends the turn. Each exchange is recorded, so a test
can check that the client parsed mlxd's streamed call: that it sent the call
back as its own assistant turn and ran it (the file's text in the result).
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

# The file a client is made to read, and what its tool's result must then hold.
MARKER = "PELICAN-7"
NOTE = f"The keeper of this file is {MARKER}.\n"
# Headers that belong to one hop, not to the exchange (and accept-encoding:
# the recorded answer is read as it comes, uncompressed).
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding",
       "content-encoding"}


@dataclass
class Exchange:
    path: str
    body: Any  # the JSON the daemon got (after the rewrite), None for a GET
    answer: str = ""


@dataclass
class ForcingProxy:
    upstream: str  # the daemon's URL
    tool: str  # the client's name for its file-reading tool
    path: str  # the one file it is made to read
    cap: int | None = None  # the most max_tokens a request may ask for
    exchanges: list[Exchange] = field(default_factory=list)
    forced: Exchange | None = None
    # Why a request with the tool was not forced (its parameters not as expected).
    refused: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                proxy._relay(self, None)

            def do_POST(self) -> None:  # noqa: N802
                proxy._relay(self, self.rfile.read(int(self.headers.get("content-length", "0"))))

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ForcingProxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def after(self, exchange: Exchange) -> list[Exchange]:
        """The chat requests sent after ``exchange``."""
        chats = [e for e in self.exchanges if e.path.endswith("/chat/completions")]
        return chats[chats.index(exchange) + 1:]

    def _rewrite(self, path: str, raw: bytes | None) -> tuple[bytes | None, Any, bool]:
        if raw is None or not path.endswith("/chat/completions"):
            return raw, None, False
        body = json.loads(raw)
        if self.cap is not None:
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = min(body.get("max_tokens") or self.cap, self.cap)
        tools = body.get("tools") or []
        tool = next((t for t in tools if t.get("function", {}).get("name") == self.tool), None)
        with self._lock:
            if self.forced is not None or tool is None or body["messages"][-1]["role"] != "user":
                return json.dumps(body).encode(), body, False
            required = tool["function"].get("parameters", {}).get("required", [])
            if len(required) != 1:
                self.refused.append(f"{self.tool} requires {required}, not one path")
                return json.dumps(body).encode(), body, False
            narrowed = {"type": "object", "properties": {required[0]: {"type": "string", "enum": [self.path]}},
                        "required": required, "additionalProperties": False}
            tool = {**tool, "function": {**tool["function"], "parameters": narrowed}}
            body = {**body, "tools": [tool if t.get("function", {}).get("name") == self.tool else t for t in tools],
                    "tool_choice": {"type": "function", "function": {"name": self.tool}}}
            return json.dumps(body).encode(), body, True

    def _relay(self, handler: BaseHTTPRequestHandler, raw: bytes | None) -> None:
        sent, body, forced = self._rewrite(handler.path, raw)
        exchange = Exchange(handler.path, body)
        with self._lock:
            self.exchanges.append(exchange)
            if forced:
                self.forced = exchange
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP}
        with httpx.Client(timeout=600) as http, http.stream(handler.command, self.upstream + handler.path,
                                                              content=sent, headers=headers) as answer:
            handler.send_response(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() not in HOP:
                    handler.send_header(name, value)
            handler.send_header("transfer-encoding", "chunked")
            handler.end_headers()
            got = bytearray()
            for data in answer.iter_raw():
                got += data
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
            exchange.answer = got.decode("utf-8", "replace")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes its kept-alive connection is not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def streamed_call(answer: str) -> tuple[str, str, dict[str, Any]]:
    """The one tool call in a streamed chat answer: its id, name and arguments."""
    ids, names, arguments = set(), "", ""
    for line in answer.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            for call in (choice.get("delta") or choice.get("message") or {}).get("tool_calls") or []:
                ids.add(call.get("id") or "")
                names += call.get("function", {}).get("name") or ""
                arguments += call.get("function", {}).get("arguments") or ""
    ids.discard("")
    (call_id,) = ids
    return call_id, names, json.loads(arguments)


def assert_client_ran_the_call(proxy: ForcingProxy, marker: str) -> None:
    """The client parsed the call mlxd streamed for the forced request, sent
    it back as its own assistant turn (same id, name, arguments) and ran it:
    its result, under the call's id, holds the file's ``marker``."""
    assert proxy.forced is not None, (proxy.refused, [e.path for e in proxy.exchanges])
    call_id, name, arguments = streamed_call(proxy.forced.answer)
    assert name == proxy.tool and list(arguments.values()) == [proxy.path], (name, arguments)
    followed = [e for e in proxy.after(proxy.forced) if e.body and any(
        m.get("role") == "tool" and m.get("tool_call_id") == call_id for m in e.body["messages"])]
    assert followed, [e.body["messages"][-1] for e in proxy.after(proxy.forced) if e.body]
    messages = followed[0].body["messages"]
    turn = next(m for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
    (sent_back,) = turn["tool_calls"]
    assert sent_back["id"] == call_id and sent_back["function"]["name"] == name
    assert json.loads(sent_back["function"]["arguments"]) == arguments
    result = next(m for m in messages if m.get("role") == "tool" and m.get("tool_call_id") == call_id)
    content = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert marker in content, content[:2000]
