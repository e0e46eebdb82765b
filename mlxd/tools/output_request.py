"""What a request asks of the answer's shape, whatever surface it came in
on. It lives below the API layer so that an engine can take it as part of
its request and settle it itself (a text engine plans tools and a grammar,
a remote engine forwards it, a vision engine refuses what it cannot do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutputRequest:
    """What a request asks of the answer's shape, in OpenAI chat's terms
    (``tools`` as ``{"type": "function", "function": {...}}``, ``tool_choice``
    "auto" / "required" / "none" / a named function, ``response_format``):
    every surface maps its own fields onto these, and ``mlxd.tools.output_plan``
    checks them against the model's tool-call format once a lease is held."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # Where each of ``tools`` is in the surface's body (None: ``tools[i]``).
    tool_params: tuple[str, ...] | None = None

    def asks_anything(self) -> bool:
        return bool(self.tools) or self.tool_choice is not None or self.response_format is not None
