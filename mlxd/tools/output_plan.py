"""From a request's typed output specs to what the engine needs.

A local engine (``engine/local_output.py``) and a token count call
``plan_output`` with the request's ``OutputRequest`` (each surface parsed
its own fields into it) and the model's tool format;
it gets back what to put on the ``GenerationRequest`` (``tools`` for the
template, a ``constraint``) and the format to split the answer with. What
no single field shows (a tool name given twice, a choice naming no tool, a
forced call with a response format) is a BadRequest here, named where the
surface's client put the field. Pure: no MLX.
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
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec

# With parallel_tool_calls a forced answer may hold this many calls.
MAX_PARALLEL_CALLS = 4


@dataclass(frozen=True)
class OutputPlan:
    # Rendered by the chat template (None: no tools in the prompt).
    tools: list[dict[str, Any]] | None = None
    # What the answer's calls are parsed against: those and the deferred tools.
    callable_tools: list[dict[str, Any]] | None = None
    constraint: Constraint | None = None
    # Split the answer into text and calls with this (None: the answer is text).
    tool_format: ToolFormat | None = None
    # The grammar forces a call: the whole answer is the call's markup and JSON.
    forces_call: bool = False


def plan_output(model: str, tool_format: ToolFormat | None, asked: OutputRequest) -> OutputPlan:
    constraint = _constraint(asked.response_format)
    choice = _choice(asked.tool_choice, asked.tools)
    if not asked.tools or choice == "none":
        # "none": the model answers in text; calls in the history still render.
        return OutputPlan(constraint=constraint)
    fmt = require(tool_format, model)
    tools, callable_tools = asked.template_tools(), asked.callable_tools()
    if choice == "auto":
        return OutputPlan(tools=tools, callable_tools=callable_tools, constraint=constraint, tool_format=fmt)
    if constraint is not None:
        raise _combined(asked.response_format)
    name = None if choice == "required" else choice
    calls = MAX_PARALLEL_CALLS if choice == "required" and asked.parallel_tool_calls else 1
    # A forced call is of a tool the model knows (or the one named): not of
    # a deferred one no search has shown it.
    known = [t for t in asked.tools if t.known or t.name == name]
    return OutputPlan(
        tools=tools, callable_tools=callable_tools, constraint=forced_call(fmt, known, name, max_calls=calls),
        tool_format=fmt, forces_call=True,
    )


def check_output(asked: OutputRequest) -> None:
    """What ``plan_output`` checks that does not depend on the model: run
    before the lease, so that a stream can still answer with a 400."""
    choice = _choice(asked.tool_choice, asked.tools)
    fmt = asked.response_format
    if fmt is not None and fmt.kind != "text" and asked.tools and choice not in ("none", "auto"):
        raise _combined(fmt)


def whole_answer_grammar(asked: OutputRequest) -> str | None:
    """The field whose grammar would constrain the answer from its first
    token (a JSON format, a tool_choice that forces a call), as the client
    named it; None when the answer is free."""
    fmt = asked.response_format
    if fmt is not None and fmt.kind != "text":
        return fmt.param
    choice = asked.tool_choice
    if choice is not None and asked.tools and _choice(choice, asked.tools) not in ("none", "auto"):
        return choice.param
    return None


def _combined(fmt: ResponseFormat | None) -> BadRequest:
    param = fmt.param if fmt is not None else "response_format"
    return BadRequest(f"{param} cannot be combined with a tool_choice that forces a call.", param=param)


def _constraint(fmt: ResponseFormat | None) -> Constraint | None:
    if fmt is None or fmt.kind == "text":
        return None
    if fmt.kind == "json_object":
        return Constraint.json_object(param=fmt.param)
    # OpenAI's strict mode allows no key the schema does not declare.
    return Constraint.json_schema(closed(fmt.schema) if fmt.strict else fmt.schema, param=fmt.param)


def _unique(tools: Sequence[ToolSpec]) -> None:
    seen: dict[str, str] = {}
    for tool in tools:
        if tool.name in seen:
            # The model could not say which one it calls, nor the parser.
            raise BadRequest(
                f"{tool.param}: the tool name `{tool.name}` is already used by {seen[tool.name]}; "
                "tool names must be unique.",
                param=tool.param,
            )
        seen[tool.name] = tool.param


def _choice(choice: ToolChoice | None, tools: Sequence[ToolSpec]) -> str:
    """"none", "auto", "required", or the name of the function to call."""
    _unique(tools)
    if choice is None:
        return "auto" if tools else "none"
    if choice.mode == "required" and not tools:
        raise BadRequest("tool_choice `required` needs `tools`.", param=choice.param)
    if choice.mode != "named":
        return choice.mode
    if choice.name not in {t.name for t in tools}:
        raise BadRequest(f"tool_choice names `{choice.name}`, which is not in `tools`.", param=choice.param)
    return str(choice.name)
