"""Request capture, for finding out why a turn was slow: the prompt as the
model saw it (templated), the output, and the prefix-cache decision
(``engine/cache_explain.py``). Off by default; an admin turns it on for
every model or for some (``PUT /v1/capture``); bounded in entries and in
characters kept per entry; found by ``X-Request-Id`` or response id.
Event loop only."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# Characters kept of a prompt and of an output: the end of a long agent
# prompt (the newest turn) matters most, so a prompt keeps its tail.
MAX_PROMPT_CHARS = 200_000
MAX_OUTPUT_CHARS = 50_000


@dataclass(eq=False)
class Captured:
    request_id: str
    response_id: str
    model: str
    key: str
    surface: str
    started_at: float = field(default_factory=time.time)
    prompt_text: str | None = None
    prompt_tokens: int | None = None
    decision: dict[str, Any] | None = None
    output: str = ""
    status: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    # --- what the engine reports (PromptCapture) ---------------------------
    def prompt(self, text: str, tokens: int, decision: dict[str, Any] | None) -> None:
        self.prompt_text = text if len(text) <= MAX_PROMPT_CHARS else "…" + text[-MAX_PROMPT_CHARS:]
        self.prompt_tokens = tokens
        self.decision = decision

    def add_output(self, text: str) -> None:
        room = MAX_OUTPUT_CHARS - len(self.output)
        if room > 0:
            self.output += text[:room]

    def finished(self, status: int, finish: str | None, error: str | None) -> None:
        self.status, self.finish_reason, self.error = status, finish, error

    def summary(self) -> dict[str, Any]:
        decision = self.decision or {}
        return {
            "request_id": self.request_id, "response_id": self.response_id, "model": self.model, "key": self.key,
            "surface": self.surface, "started_at": round(self.started_at, 3), "status": self.status,
            "prompt_tokens": self.prompt_tokens, "hit_tokens": decision.get("hit_tokens"),
            "reason": decision.get("reason"),
        }

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary(), "prompt": self.prompt_text, "output": self.output, "cache": self.decision,
                "finish_reason": self.finish_reason, "error": self.error}


class CaptureStore:
    def __init__(self, max_entries: int = 50) -> None:
        self.max_entries = max_entries
        self.everything = False
        self.models: frozenset[str] = frozenset()
        self._entries: OrderedDict[int, Captured] = OrderedDict()
        self._by_id: dict[str, Captured] = {}

    def settings(self) -> dict[str, Any]:
        return {"enabled": self.everything or bool(self.models), "all_models": self.everything,
                "models": sorted(self.models), "max_entries": self.max_entries, "captured": len(self._entries)}

    def configure(self, enabled: bool, models: list[str] | None) -> dict[str, Any]:
        """``enabled`` with no ``models``: every model; with models: those;
        not enabled: nothing (what was captured stays until it ages out)."""
        self.everything = enabled and not models
        self.models = frozenset(models or ()) if enabled else frozenset()
        return self.settings()

    def wants(self, model: str) -> bool:
        return self.everything or model in self.models

    def begin(self, captured: Captured) -> Captured:
        self._entries[id(captured)] = captured
        self._by_id[captured.request_id] = captured
        self._by_id[captured.response_id] = captured
        while len(self._entries) > self.max_entries:
            _, old = self._entries.popitem(last=False)
            for key in (old.request_id, old.response_id):
                if self._by_id.get(key) is old:
                    del self._by_id[key]
        return captured

    def find(self, request_id: str) -> Captured | None:
        return self._by_id.get(request_id)

    def entries(self) -> list[Captured]:
        return list(reversed(self._entries.values()))
