"""From a chat request's tool and format fields to what the engine needs.

A local engine (``engine/local_output.py``) calls ``plan_requested`` with the
request's ``OutputRequest`` (``tools``, ``tool_choice``,
``parallel_tool_calls`` and ``response_format`` as sent, OpenAI's shapes)
and its model's tool format; it gets back what to put on the
``GenerationRequest`` (``tools`` for the template, a ``constraint``) and the
format to split the answer with. Every client mistake is a BadRequest naming
its field. Pure: no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest
from mlxd.tools.forcing import closed, forced_call
from mlxd.tools.formats import ToolFormat, require
from mlxd.tools.output_request import OutputRequest

# With parallel_tool_calls a forced answer may hold this many calls.
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class OutputPlan:
    # Rendered by the chat template (None: no tools in the prompt).
    tools: list[dict[str, Any]] | None = None
    constraint: Constraint | None = None
    # Split the answer into text and calls with this (None: the answer is text).
    tool_format: ToolFormat | None = None
    # The grammar forces a call: the whole answer is the call's markup and JSON.
    forces_call: bool = False


def plan_output(
    model: str,
    tool_format: ToolFormat | None,
    *,
    tools: Any = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = None,
    response_format: Any = None,
    tool_params: Sequence[str] | None = None,
) -> OutputPlan:
    """``tool_params``: where each of ``tools`` is in the surface's request
    body (``tools[i]`` when not given: a surface that leaves tools out
    numbers the rest as its client did)."""
    constraint = _response_format(response_format)
    checked = _tools(tools, tool_params)
    choice = _tool_choice(tool_choice, checked)
    if not checked or choice == "none":
        # "none": the model answers in text; calls in the history still render.
        return OutputPlan(constraint=constraint)
    fmt = require(tool_format, model)
    if choice == "auto":
        return OutputPlan(tools=checked, constraint=constraint, tool_format=fmt)
    if constraint is not None:
        raise BadRequest(
            "response_format cannot be combined with a tool_choice that forces a call.",
            param="response_format",
        )
    name = None if choice == "required" else choice
    calls = MAX_PARALLEL_CALLS if choice == "required" and parallel_tool_calls else 1
    return OutputPlan(
        tools=checked, constraint=forced_call(fmt, checked, name, max_calls=calls), tool_format=fmt, forces_call=True
    )


def plan_requested(name: str, tool_format: ToolFormat | None, asked: OutputRequest) -> OutputPlan:
    """What ``asked`` comes to on a model with ``tool_format``: an engine
    settling a request and a token count of the same request both ask here."""
    return plan_output(
        name,
        tool_format,
        tools=asked.tools,
        tool_choice=asked.tool_choice,
        parallel_tool_calls=asked.parallel_tool_calls,
        response_format=asked.response_format,
        tool_params=asked.tool_params,
    )


def check_output(
    *, tools: Any = None, tool_choice: Any = None, response_format: Any = None,
    tool_params: Sequence[str] | None = None,
) -> None:
    """What ``plan_output`` checks that does not depend on the model: run
    before the lease, so that a stream can still answer with a 400."""
    constraint = _response_format(response_format)
    checked = _tools(tools, tool_params)
    choice = _tool_choice(tool_choice, checked)
    if constraint is not None and checked and choice not in ("none", "auto"):
        raise BadRequest(
            "response_format cannot be combined with a tool_choice that forces a call.",
            param="response_format",
        )


def _response_format(value: Any) -> Constraint | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be a JSON schema object.", param="response_format"
            )
        # OpenAI's strict mode allows no key the schema does not declare.
        return Constraint.json_schema(closed(schema) if spec.get("strict") else schema)
    raise BadRequest(
        "response_format.type must be one of `text`, `json_object`, `json_schema`.", param="response_format"
    )


def _tools(tools: Any, params: Sequence[str] | None = None) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list.", param="tools")
    checked = []
    seen: dict[str, str] = {}
    for i, tool in enumerate(tools):
        where = params[i] if params is not None and i < len(params) else f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise BadRequest(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}.", param=where)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"{where}.function.name must be a non-empty string.", param=where)
        if name in seen:
            # The model could not say which one it calls, nor the parser.
            raise BadRequest(
                f"{where}: the tool name `{name}` is already used by {seen[name]}; tool names must be unique.",
                param=where,
            )
        seen[name] = where
        if "parameters" in function and not _object_schema(function["parameters"]):
            raise BadRequest(
                f"{where}: the tool's parameters must be described by a JSON schema of an object "
                "(`{\"type\": \"object\", \"properties\": {...}}`).",
                param=where,
            )
        checked.append(tool)
    return checked


def _object_schema(schema: Any) -> bool:
    """Whether ``schema`` can describe an object of arguments, by its top level
    only (compiling it is left to a forced call): a dict whose ``type``, if
    it says one, is or includes "object"."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type", "object")
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> str:
    """"none", "auto", "required", or the name of the function to call."""
    if value is None:
        return "auto" if tools else "none"
    if value in ("none", "auto", "required"):
        if value == "required" and not tools:
            raise BadRequest("tool_choice `required` needs `tools`.", param="tool_choice")
        return value
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.',
            param="tool_choice",
        )
    if name not in {t["function"]["name"] for t in tools}:
        raise BadRequest(f"tool_choice names `{name}`, which is not in `tools`.", param="tool_choice")
    return name
