"""Typed tool specs, tool choice and response format: what a request asks of
the answer's shape, parsed once by its surface's bodies module.

Each value remembers where it is in the surface's own body (``param``:
``tools[2]``, ``text.format``), so a check further down names the field as
that surface's client spelled it, with no renaming afterwards. What a chat
template or a remote backend takes (OpenAI's JSON) is rendered from these:
``ToolSpec.template_form`` for the template and the wire alike,
``OutputRequest.openai_json`` (output_request.py) for a remote backend.
Pure: no MLX, no API types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# How a schema of an object of arguments is described, in error messages.
OBJECT_SCHEMA = '(`{"type": "object", "properties": {...}}`)'


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call."""

    name: str
    # Where the tool is in the surface's body (``tools[2]``: the error's param).
    param: str
    # None: the client gave none (the template gets no such key).
    description: str | None = None
    # The arguments' JSON schema, an object's (checked by the surface's
    # parser); None: the client gave none, and the function takes anything.
    parameters: dict[str, Any] | None = None
    # Where the schema is, as the surface spells it (``tools[2].input_schema``).
    schema_param: str | None = None
    # OpenAI chat's ``function.strict``, passed on to a remote backend.
    strict: bool | None = None
    # Anthropic's ``defer_loading`` (tool search): a deferred tool is not in
    # the prompt's tool list (``listed``); the model knows it only where a
    # search found it (``known``: its definition is written into that tool
    # result), and may call it then. Keeping it out of the list keeps the
    # prompt's head, and so the prefix cache, the same as a search adds tools.
    listed: bool = True
    known: bool = True

    def template_form(self) -> dict[str, Any]:
        """The tool as chat templates (and OpenAI's wire) take it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


ChoiceMode = Literal["auto", "required", "none", "named"]


@dataclass(frozen=True)
class ToolChoice:
    """Whether the model may, must or must not call, or which tool it calls."""

    mode: ChoiceMode
    # The tool to call, for "named".
    name: str | None = None
    param: str = "tool_choice"
    openai_name = "tool_choice"

    def openai_form(self) -> str | dict[str, Any]:
        if self.mode == "named":
            return {"type": "function", "function": {"name": self.name}}
        return self.mode


@dataclass(frozen=True)
class ResponseFormat:
    """Plain text, any JSON object, or JSON that a schema describes."""

    kind: Literal["text", "json_object", "json_schema"]
    # Where the format is in the surface's body (``response_format``, ``text.format``).
    param: str = "response_format"
    # For "json_schema": the schema (an object), its name and OpenAI's
    # strict mode (no key the schema does not declare).
    schema: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None
    strict: bool | None = None
    openai_name = "response_format"

    def openai_form(self) -> dict[str, Any]:
        if self.kind != "json_schema":
            return {"type": self.kind}
        spec: dict[str, Any] = {}
        for key in ("name", "description"):
            if getattr(self, key) is not None:
                spec[key] = getattr(self, key)
        spec["schema"] = self.schema
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


def object_schema(schema: Any) -> bool:
    """Whether ``schema`` can describe an object of arguments, by its top level
    only (compiling it is left to a forced call): a dict whose ``type``, if
    it says one, is or includes "object"."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type", "object")
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def not_an_object_schema(where: str) -> str:
    """The message for a tool schema at ``where`` that is no object's."""
    return f"{where} must be a JSON schema of an object {OBJECT_SCHEMA}."
