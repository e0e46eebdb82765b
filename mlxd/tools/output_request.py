"""What a request asks of the answer's shape, whatever surface it came in
on. It lives below the API layer so that an engine can take it as part of
its request and settle it itself (a text engine plans tools and a grammar,
a remote engine forwards it, a vision engine refuses what it cannot do)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec

_WIRE_TOOL = re.compile(r"tools\[(\d+)\](.*)")
_WIRE_SCHEMA = ".function.parameters"


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
        """The tools a chat template lists, as it renders them (None: no
        tools); a deferred tool is not among them (``ToolSpec.listed``)."""
        return [tool.template_form() for tool in self.tools if tool.listed] or None

    def callable_tools(self) -> list[dict[str, Any]] | None:
        """Every tool the model may call, listed or deferred: what its calls
        are parsed against."""
        return [tool.template_form() for tool in self.tools] or None

    def openai_json(self) -> dict[str, Any]:
        """The request's output fields as OpenAI chat's JSON, for a remote
        backend (which applies its own tool-call format and grammar): the
        one place they are rendered for the wire."""
        out: dict[str, Any] = {}
        if self.tools:
            # A backend of OpenAI's wire has no deferred tools: it is sent all.
            out["tools"] = self.callable_tools()
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice.openai_form()
        if self.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = self.parallel_tool_calls
        if self.response_format is not None:
            out["response_format"] = self.response_format.openai_form()
        return out

    def client_param(self, wire: str) -> str:
        """Where a field of ``openai_json`` that a remote backend refused is
        in the client's own body: the wire's ``tools[0]`` may be a surface's
        ``tools[2]`` (server tools left out) and its schema ``input_schema``,
        the wire's ``response_format`` the Responses API's ``text.format``.
        Any other param as the backend said it."""
        tool = _WIRE_TOOL.fullmatch(wire)
        if tool is not None and int(tool[1]) < len(self.tools):
            spec, rest = self.tools[int(tool[1])], tool[2]
            if rest.startswith(_WIRE_SCHEMA) and spec.schema_param is not None:
                return spec.schema_param + rest[len(_WIRE_SCHEMA):]
            return spec.param
        head = wire.split(".", 1)[0]
        for asked in (self.response_format, self.tool_choice):
            # The wire's sub-fields are the surface's own where it spells the field as the wire does.
            if asked is not None and head == asked.openai_name and asked.param != head:
                return asked.param
        return wire
