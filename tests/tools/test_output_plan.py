"""What a chat request's tools / tool_choice / response_format turn into (pure)."""

from __future__ import annotations

import pytest

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest
from mlxd.tools.formats import format_named
from mlxd.tools.output_plan import plan_output

HERMES = format_named("json_tools")
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def test_no_tools_no_format_is_plain_text():
    assert plan_output("m", None).constraint is None


def test_auto_renders_the_tools_and_parses_without_forcing():
    plan = plan_output("m", HERMES, tools=TOOLS)
    assert plan.tools == TOOLS and plan.tool_format is HERMES and plan.constraint is None


def test_none_hides_the_tools():
    plan = plan_output("m", HERMES, tools=TOOLS, tool_choice="none")
    assert plan.tools is None and plan.tool_format is None


def test_required_and_named_are_forced_by_a_grammar():
    required = plan_output("m", HERMES, tools=TOOLS, tool_choice="required")
    named = plan_output("m", HERMES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    for plan in (required, named):
        assert plan.constraint is not None and plan.constraint.kind == "lark"
        assert '"const": "add"' in plan.constraint.text
        assert plan.forces_call
    assert not plan_output("m", HERMES, tools=TOOLS).forces_call
    parallel = plan_output("m", HERMES, tools=TOOLS, tool_choice="required", parallel_tool_calls=True)
    assert "{0,3}" in parallel.constraint.text and "{0," not in required.constraint.text


def test_response_formats():
    assert plan_output("m", None, response_format={"type": "text"}).constraint is None
    assert plan_output("m", None, response_format={"type": "json_object"}).constraint == Constraint.json_object()
    schema = {"type": "object", "properties": {"x": {"type": "boolean"}}}
    got = plan_output("m", None, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert got.constraint == Constraint.json_schema(schema)


def test_strict_closes_the_schema_where_it_says_nothing_about_other_keys():
    import json

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "sub": {"type": "object", "properties": {}}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    strict = json.loads(plan_output("m", None, response_format=fmt).constraint.text)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["sub"]["additionalProperties"] is False
    loose = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert plan_output("m", None, response_format=loose).constraint == Constraint.json_schema(schema)


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": TOOLS, "fmt": None}, "tools", "tool_parser"),  # a model without a format
        ({"tools": [{"type": "retrieval"}]}, "tools[0]", "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0]", "name"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "tool_choice must be"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "sub"}}}, "tool_choice", "sub"),
        ({"tool_choice": "required"}, "tool_choice", "needs `tools`"),
        ({"tools": [*TOOLS, *TOOLS]}, "tools[1]", "`add` is already used by tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "s", "parameters": {"type": "string"}}}]}, "tools[0]",
         "object"),
        # A surface that leaves some tools out names the rest where its client put them.
        ({"tools": [*TOOLS, *TOOLS], "tool_params": ("tools[2]", "tools[5]")}, "tools[5]", "used by tools[2]"),
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ],
)
def test_client_mistakes_are_bad_requests_naming_the_field(fields, param, words):
    fields = dict(fields)
    fmt = fields.pop("fmt", HERMES)
    with pytest.raises(BadRequest) as info:
        plan_output("m", fmt, **fields)
    assert info.value.param == param
    assert words in info.value.message


def test_forcing_and_a_response_format_do_not_combine():
    with pytest.raises(BadRequest, match="combined"):
        plan_output("m", HERMES, tools=TOOLS, tool_choice="required", response_format={"type": "json_object"})
