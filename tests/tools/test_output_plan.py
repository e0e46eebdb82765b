"""What a request's typed tools / tool_choice / response_format turn into (pure)."""

from __future__ import annotations

import json

import pytest

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest
from mlxd.tools.formats import format_named
from mlxd.tools.output_plan import check_output, plan_output
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec

HERMES = format_named("json_tools")
ADD = ToolSpec("add", "tools[0]", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
TOOLS = (ADD,)
TEMPLATE_TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD.parameters}}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "sub": {"type": "object", "properties": {}}}}


def plan(fmt=HERMES, **fields):
    return plan_output("m", fmt, OutputRequest(**fields))


def test_no_tools_no_format_is_plain_text():
    assert plan(None).constraint is None


def test_auto_renders_the_tools_in_the_templates_shape_and_parses_without_forcing():
    auto = plan(tools=TOOLS)
    assert auto.tools == TEMPLATE_TOOLS and auto.tool_format is HERMES and auto.constraint is None


def test_none_hides_the_tools():
    hidden = plan(tools=TOOLS, tool_choice=ToolChoice("none"))
    assert hidden.tools is None and hidden.tool_format is None


def test_required_and_named_are_forced_by_a_grammar():
    required = plan(tools=TOOLS, tool_choice=ToolChoice("required"))
    named = plan(tools=TOOLS, tool_choice=ToolChoice("named", "add"))
    for forced in (required, named):
        assert forced.constraint is not None and forced.constraint.kind == "lark"
        assert '"const": "add"' in forced.constraint.text
        assert forced.forces_call
    assert not plan(tools=TOOLS).forces_call
    parallel = plan(tools=TOOLS, tool_choice=ToolChoice("required"), parallel_tool_calls=True)
    assert "{0,3}" in parallel.constraint.text and "{0," not in required.constraint.text


def test_response_formats():
    assert plan(None, response_format=ResponseFormat("text")).constraint is None
    assert plan(None, response_format=ResponseFormat("json_object")).constraint == Constraint.json_object()
    got = plan(None, response_format=ResponseFormat("json_schema", schema=SCHEMA, name="x"))
    assert got.constraint == Constraint.json_schema(SCHEMA)


def test_the_grammar_remembers_the_field_it_came_from_for_a_compile_error():
    fmt = ResponseFormat("json_schema", param="text.format", schema=SCHEMA)
    assert plan(None, response_format=fmt).constraint.param == "text.format"


def test_strict_closes_the_schema_where_it_says_nothing_about_other_keys():
    strict = json.loads(plan(None, response_format=ResponseFormat("json_schema", schema=SCHEMA, strict=True))
                        .constraint.text)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["sub"]["additionalProperties"] is False
    loose = plan(None, response_format=ResponseFormat("json_schema", schema=SCHEMA))
    assert loose.constraint == Constraint.json_schema(SCHEMA)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": TOOLS, "fmt": None}, "tools", "tool_parser"),  # tool_parser: none
        ({"tools": TOOLS, "tool_choice": ToolChoice("named", "sub")}, "tool_choice", "sub"),
        ({"tool_choice": ToolChoice("required")}, "tool_choice", "needs `tools`"),
        ({"tools": (ADD, ToolSpec("add", "tools[1]"))}, "tools[1]", "`add` is already used by tools[0]"),
        # Each spec names where its client put it (a surface may leave some tools out).
        ({"tools": (ToolSpec("add", "tools[2]"), ToolSpec("add", "tools[5]"))}, "tools[5]", "used by tools[2]"),
        ({"tools": TOOLS, "tool_choice": ToolChoice("required"),
          "response_format": ResponseFormat("json_object", param="text.format")},
         "text.format", "text.format cannot be combined"),
    ],
)
def test_client_mistakes_are_bad_requests_naming_the_field(fields, param, words):
    fields = dict(fields)
    fmt = fields.pop("fmt", HERMES)
    with pytest.raises(BadRequest) as info:
        plan(fmt, **fields)
    assert info.value.param == param
    assert words in info.value.message


def test_the_check_before_the_lease_refuses_what_the_plan_would():
    forced_with_format = OutputRequest(tools=TOOLS, tool_choice=ToolChoice("named", "add"),
                                       response_format=ResponseFormat("json_object"))
    with pytest.raises(BadRequest, match="response_format cannot be combined"):
        check_output(forced_with_format)
    with pytest.raises(BadRequest, match="not in `tools`"):
        check_output(OutputRequest(tool_choice=ToolChoice("named", "gone")))
    check_output(OutputRequest(tools=TOOLS, response_format=ResponseFormat("json_object")))  # auto: both apply
