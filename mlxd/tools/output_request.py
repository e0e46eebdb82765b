"""What a request asks of the answer's shape, whatever surface it came in
on. It lives below the API layer so that an engine can take it as part of
its request and settle it itself (a text engine plans tools and a grammar,
a remote engine forwards it, a vision engine refuses what it cannot do)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec


@dataclass(frozen=True)
class OutputRequest:
    """Typed values (output_specs.py), each parsed once by its surface's
    bodies module and naming where it is in that surface's body;
    ``mlxd.tools.output_plan`` checks them, and plans them against the
    model's tool-call format once a lease is held."""

    tools: tuple[ToolSpec, ...] = ()
    # None: the surface said nothing ("auto" with tools, else "none").
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    def asks_anything(self) -> bool:
        return bool(self.tools) or self.tool_choice is not None or self.response_format is not None

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as a chat template renders them (None: no tools)."""
        return [tool.template_form() for tool in self.tools] or None

    def openai_json(self) -> dict[str, Any]:
        """The request's output fields as OpenAI chat's JSON, for a remote
        backend (which applies its own tool-call format and grammar): the
        one place they are rendered for the wire."""
        out: dict[str, Any] = {}
        if self.tools:
            out["tools"] = self.template_tools()
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice.openai_form()
        if self.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = self.parallel_tool_calls
        if self.response_format is not None:
            out["response_format"] = self.response_format.openai_form()
        return out
