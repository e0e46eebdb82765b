"""Keep up with the agent CLIs: record the requests each pinned CLI sends and
compare their shapes with the recorded ones.

Claude Code and Codex change what they send between versions (new body
fields, new headers, a WebSocket first, a model catalog fetch), and so do
the npm coding CLIs of docs/clients.md (OpenCode, Qwen Code, pi, Continue
CLI, on the chat API). This runs
each CLI from ``.agents/`` (``scripts/setup.sh --tests``) for one turn
against a recording endpoint that answers like mlxd would (a short text
answer in each surface's stream shape), reduces every request to its shape
(method, path, query keys, header names, the body's key tree with value
types, tool names) and reports what differs from
``bench/recorded/agent_requests.json``: run it after bumping a pin in
scripts/setup.sh, then ``--record`` to accept the new shapes.

    .venv/bin/python -m bench.agent_requests            # compare
    .venv/bin/python -m bench.agent_requests --record   # store the current shapes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.common import ROOT, save

# Each CLI and the npm package scripts/setup.sh pins it from.
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "opencode": "opencode-ai",
            "qwen": "@qwen-code/qwen-code", "pi": "@mariozechner/pi-coding-agent", "cn": "@continuedev/cli"}
RECORDED = ROOT / "bench" / "recorded" / "agent_requests.json"
BIN = ROOT / ".agents" / "node_modules" / ".bin"
# Header values that change every run; their names still count.
VOLATILE = {"x-client-request-id", "session-id", "thread-id", "x-codex-window-id", "x-codex-turn-metadata",
            "content-length", "host", "user-agent", "authorization", "x-api-key", "sec-websocket-key",
            "x-stainless-retry-count", "x-stainless-timeout", "x-claude-code-session-id"}


def shape(value: Any) -> Any:
    """The type tree of a JSON value: objects keep their keys, lists the union of their items' shapes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        items = []
        for item in value:
            s = shape(item)
            if s not in items:
                items.append(s)
        return items
    return type(value).__name__


def request_shape(method: str, path: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    url = urlsplit(path)
    out: dict[str, Any] = {
        "request": f"{method} {url.path}",
        "query": sorted(parse_qs(url.query, keep_blank_values=True)),
        "headers": sorted(k.lower() for k in headers),
        "fixed_headers": {k.lower(): v for k, v in sorted(headers.items())
                          if k.lower() not in VOLATILE and k.lower().startswith(("anthropic-", "openai-", "upgrade"))},
    }
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            return {**out, "body": "not json"}
        out["body"] = shape(parsed)
        tools = parsed.get("tools") if isinstance(parsed, dict) else None
        if isinstance(tools, list):
            out["tools"] = sorted(str(_tool_name(t)) for t in tools if isinstance(t, dict))
    return out


def _tool_name(tool: dict[str, Any]) -> Any:
    """A tool's name: at the top (Messages, Responses) or under ``function`` (chat)."""
    function = tool.get("function") if isinstance(tool.get("function"), dict) else {}
    return tool.get("name") or function.get("name") or tool.get("type")


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {k}\ndata: {json.dumps(v)}\n\n".encode() for k, v in events)


def _anthropic_stream(model: str) -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}
    return _sse([
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ])


def _responses_stream(model: str) -> bytes:
    item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}]}
    done = {"id": "resp_1", "object": "response", "status": "completed", "model": model, "output": [item],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    events = [("response.created", {"response": {**done, "status": "in_progress", "output": []}}),
              ("response.output_item.added", {"output_index": 0, "item": {**item, "status": "in_progress", "content": []}}),
              ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "ok"}),
              ("response.output_item.done", {"output_index": 0, "item": item}),
              ("response.completed", {"response": done})]
    return _sse([(k, {"type": k, "sequence_number": i, **v}) for i, (k, v) in enumerate(events)])


def _chat_answer(model: str, stream: bool) -> tuple[bytes, str]:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    if not stream:
        return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model, "usage": usage,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                        "finish_reason": "stop"}]}).encode(), "application/json"
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {**head, "choices": [], "usage": usage}]
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n", "text/event-stream"


# One model as mlxd's /v1/models lists it for Claude Code (a `claude-*` alias, the window in Anthropic's fields).
LISTED = {"id": "claude-default", "type": "model", "display_name": "default", "created_at": "2026-01-01T00:00:00Z",
          "max_input_tokens": 8192, "max_tokens": 8192}
# What Claude Code keeps of that listing, in its cache files under ~/.claude/cache: 2.1.197 keeps `id` and
# `display_name` (gateway discovery) and has its capabilities fetch, which reads `max_input_tokens`, off.
CLAUDE_CACHES = ("gateway-models.json", "model-capabilities.json")


def kept_fields(home: Path) -> list[dict[str, Any]]:
    """The fields of mlxd's model listing Claude Code stored, per cache file it wrote."""
    out = []
    for name in CLAUDE_CACHES:
        try:
            models = json.loads((home / ".claude" / "cache" / name).read_text())["models"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append({"request": f"kept in ~/.claude/cache/{name}", "fields": sorted({k for m in models for k in m})})
    return out


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _record(self, body: bytes) -> None:
        self.seen.append(request_shape(self.command, self.path, dict(self.headers), body))

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._record(b"")
        if self.headers.get("upgrade", "").lower() == "websocket":
            self._answer(426, b'{"error": {"message": "no websocket"}}')
        elif urlsplit(self.path).path == "/v1/models":
            self._answer(200, json.dumps({"object": "list", "data": [LISTED], "models": []}).encode())
        else:
            self._answer(404, b"{}")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self._record(body)
        request = json.loads(body or b"{}")
        model = str(request.get("model", "m"))
        path = urlsplit(self.path).path
        if path == "/v1/chat/completions":
            self._answer(200, *_chat_answer(model, bool(request.get("stream"))))
        elif path == "/v1/messages":
            self._answer(200, _anthropic_stream(model), "text/event-stream")
        elif path == "/v1/responses":
            self._answer(200, _responses_stream(model), "text/event-stream")
        else:
            self._answer(404, b"{}")


def run_cli(name: str, url: str, home: Path) -> None:
    """One turn of CLI ``name`` against ``url``, set up as docs/agents.md and docs/clients.md show."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(HOME=str(home), PWD=str(home))
    if name == "claude":
        env.update(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-local", DISABLE_TELEMETRY="1",
                   DISABLE_AUTOUPDATER="1", CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY="1")
        argv = [str(BIN / "claude"), "-p", "Say hello", "--model", "claude-sonnet-4-5"]
    elif name == "codex":
        (home / ".codex").mkdir(parents=True, exist_ok=True)
        (home / ".codex" / "config.toml").write_text(
            'model = "default"\nmodel_provider = "mlxd"\n\n[model_providers.mlxd]\nname = "mlxd"\n'
            f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "MLXD_API_KEY"\n'
            f'model_catalog_url = "{url}/v1/models"\n')
        env["MLXD_API_KEY"] = "sk-local"
        argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "Say hello"]
    elif name == "opencode":
        (home / "opencode.json").write_text(json.dumps({"provider": {"mlxd": {
            "npm": "@ai-sdk/openai-compatible", "name": "mlxd", "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
            "models": {"default": {"name": "default", "limit": {"context": 8192, "output": 1024}}}}}}))
        argv = [str(BIN / "opencode"), "run", "--model", "mlxd/default", "Say hello"]
    elif name == "qwen":
        env.update(OPENAI_API_KEY="unused", OPENAI_BASE_URL=f"{url}/v1", OPENAI_MODEL="default")
        argv = [str(BIN / "qwen"), "--auth-type", "openai", "-p", "Say hello"]
    elif name == "pi":
        (home / ".pi" / "agent").mkdir(parents=True, exist_ok=True)
        (home / ".pi" / "agent" / "models.json").write_text(json.dumps({"providers": {"mlxd": {
            "baseUrl": f"{url}/v1", "api": "openai-completions", "apiKey": "unused",
            "models": [{"id": "default", "name": "default", "contextWindow": 8192, "maxTokens": 1024}]}}}))
        argv = [str(BIN / "pi"), "-p", "--provider", "mlxd", "--model", "default", "Say hello"]
    else:
        (home / "config.yaml").write_text(
            "name: mlxd\nversion: 1.0.0\nschema: v1\nmodels:\n  - name: default\n    provider: openai\n"
            f"    model: default\n    apiBase: {url}/v1\n    apiKey: unused\n    roles: [chat]\n"
            "    defaultCompletionOptions:\n      maxTokens: 1024\n")
        argv = [str(BIN / "cn"), "-p", "--config", str(home / "config.yaml"), "Say hello"]
    subprocess.run(argv, env=env, cwd=home, capture_output=True, timeout=180, stdin=subprocess.DEVNULL)


def record(name: str) -> list[dict[str, Any]]:
    handler = type("Handler", (Recorder,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory() as home:
            run_cli(name, f"http://127.0.0.1:{server.server_address[1]}", Path(home))
            # A newer Claude Code that keeps the window from /v1/models shows up as a changed field list.
            handler.seen += kept_fields(Path(home)) if name == "claude" else []
    finally:
        server.shutdown()
    unique: list[dict[str, Any]] = []
    for seen in handler.seen:
        if seen not in unique:
            unique.append(seen)
    return unique


def differences(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    lines = []
    for label, a, b in (("gone", old, new), ("new", new, old)):
        for shape_ in a:
            if shape_ not in b:
                twin = next((s for s in b if s["request"] == shape_["request"]), None)
                changed = sorted(k for k in shape_ if twin is not None and shape_.get(k) != twin.get(k))
                lines.append(f"{label}: {shape_['request']}" + (f" (differs in {', '.join(changed)})" if changed else ""))
    return lines


def versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES.values():
        manifest = ROOT / ".agents" / "node_modules" / package / "package.json"
        out[package] = json.loads(manifest.read_text())["version"] if manifest.is_file() else "not installed"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help="store the current shapes as the recorded ones")
    args = parser.parse_args()
    current: dict[str, Any] = {"versions": versions(), **{cli: record(cli) for cli in PACKAGES}}
    stored = json.loads(RECORDED.read_text()) if RECORDED.is_file() else None
    report = {}
    print(f"{'cli':8} {'requests':>8}  changes since the recording ({(stored or {}).get('versions')})")
    for cli in PACKAGES:
        changes = differences(stored[cli], current[cli]) if stored and cli in stored else ["no recording yet"]
        if changes and stored and cli in stored:
            # A CLI's side request (OpenCode's title) may miss a loaded machine's turn: report what a second run repeats.
            again = differences(stored[cli], record(cli))
            changes = [c for c in changes if c in again]
        report[cli] = {"requests": len(current[cli]), "changes": changes}
        print(f"{cli:8} {len(current[cli]):>8}  {'; '.join(changes) or 'none'}")
    save("agent_requests", "shapes", {"versions": current["versions"], "report": report})
    if args.record:
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        RECORDED.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"recorded {RECORDED}")


if __name__ == "__main__":
    main()
