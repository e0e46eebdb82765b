"""Each surface parses its own tool, tool_choice and format fields into the
typed output specs once, naming a mistake as its client spelled the field,
and a remote backend gets them back as the OpenAI JSON it got before the
specs were typed. Pure: bodies in, values out, no app."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.api.anthropic.bodies import MessagesRequest
from mlxd.api.openai.bodies import ChatCompletionRequest
from mlxd.api.responses.bodies import ResponsesRequest
from mlxd.errors import BadRequest
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
CHAT_TOOL = {"type": "function", "function": {"name": "weather", "description": "Forecast", "parameters": SCHEMA}}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)


def anthropic(**fields: Any) -> MessagesRequest:
    return MessagesRequest(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}], **fields)


def responses(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest(model="m", input="hi", **fields)


def refusal(body: Any) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        body.output()
    return info.value


# --- chat completions ----------------------------------------------------------------


def test_chat_tools_choice_and_format_parse_into_typed_specs():
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA, "strict": True}}
    out = chat(tools=[CHAT_TOOL], tool_choice={"type": "function", "function": {"name": "weather"}},
               parallel_tool_calls=False, response_format=fmt).output()
    assert out.tools == (ToolSpec("weather", "tools[0]", description="Forecast", parameters=SCHEMA,
                                  schema_param="tools[0].function.parameters"),)
    assert out.tool_choice == ToolChoice("named", "weather")
    assert out.response_format == ResponseFormat("json_schema", schema=SCHEMA, name="out", strict=True)
    # What a remote backend gets: the client's own fields.
    assert out.openai_json() == {"tools": [CHAT_TOOL], "tool_choice": {"type": "function", "function": {"name": "weather"}},
                                 "parallel_tool_calls": False, "response_format": fmt}


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", 'tools[0] must be {"type": "function"'),
    ({"tools": [CHAT_TOOL, {"type": "function", "function": {"name": ""}}]}, "tools[1]", "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "s", "parameters": {"type": "string"}}}]}, "tools[0]",
     "tools[0].function.parameters must be a JSON schema of an object"),
    ({"tool_choice": "always"}, "tool_choice", "tool_choice must be"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format.type must be one of"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
     "response_format.json_schema.schema"),
])
def test_chat_names_a_mistake_by_chats_own_fields(fields, param, words):
    error = refusal(chat(**fields))
    assert error.param == param and words in error.message


# --- Anthropic Messages ----------------------------------------------------------------


def test_anthropic_tools_parse_under_their_own_names_leaving_server_tools_out():
    body = anthropic(tools=[{"type": "web_search_20250305", "name": "web_search"},
                            {"name": "weather", "input_schema": SCHEMA}],
                     tool_choice={"type": "any", "disable_parallel_tool_use": True})
    out = body.output()
    assert out.tools == (ToolSpec("weather", "tools[1]", description="", parameters=SCHEMA,
                                  schema_param="tools[1].input_schema"),)
    assert out.tool_choice == ToolChoice("required") and out.parallel_tool_calls is False
    # What the code before the typed specs sent a remote backend for the same body.
    assert out.openai_json() == {
        "tools": [{"type": "function", "function": {"name": "weather", "description": "", "parameters": SCHEMA}}],
        "tool_choice": "required", "parallel_tool_calls": False,
    }
    named = anthropic(tools=[{"name": "weather", "input_schema": SCHEMA}], tool_choice={"type": "tool", "name": "weather"})
    assert named.output().openai_json()["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


@pytest.mark.parametrize("tool", [{"name": "bare"}, {"name": "s", "input_schema": {"type": "string"}}])
def test_anthropic_names_a_missing_or_non_object_input_schema(tool):
    error = refusal(anthropic(tools=[{"type": "web_search_20250305", "name": "web_search"}, tool]))
    assert error.param == "tools[1]"
    assert "tools[1].input_schema must be a JSON schema of an object" in error.message
    assert "parameters" not in error.message


def test_anthropic_tool_choice_mistakes_name_anthropics_values():
    assert "tool_choice `any` needs `tools`" in refusal(anthropic(tool_choice={"type": "any"})).message
    assert "tool_choice.type must be one of" in refusal(anthropic(tool_choice={"type": "sometimes"})).message


# --- Responses -------------------------------------------------------------------------


def test_responses_tools_and_text_format_parse_under_their_own_names():
    body = responses(tools=[{"type": "web_search"}, {"type": "function", "name": "weather", "parameters": None}],
                     tool_choice={"type": "function", "name": "weather"},
                     text={"format": {"type": "json_schema", "name": "out", "schema": SCHEMA}})
    out = body.output()
    empty = {"type": "object", "properties": {}}
    assert out.tools == (ToolSpec("weather", "tools[1]", description="", parameters=empty,
                                  schema_param="tools[1].parameters"),)
    assert out.tool_choice == ToolChoice("named", "weather")
    assert out.response_format == ResponseFormat("json_schema", param="text.format", schema=SCHEMA, name="out")
    assert out.openai_json() == {
        "tools": [{"type": "function", "function": {"name": "weather", "description": "", "parameters": empty}}],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA}},
    }
    assert responses(text={"format": {"type": "text"}}).output().response_format is None


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [{"type": "function", "name": "s", "parameters": {"type": "array"}}]}, "tools[0]",
     "tools[0].parameters must be a JSON schema of an object"),
    ({"tools": [{"type": "function", "name": ""}]}, "tools", "tools[0].name"),
    ({"text": {"format": "json"}}, "text.format", "text.format must be an object"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "text.format.schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "text.format.type"),
])
def test_responses_names_a_mistake_by_its_own_fields(fields, param, words):
    error = refusal(responses(**fields))
    assert error.param == param and words in error.message
    assert "response_format" not in error.message and "function.parameters" not in error.message


# --- a remote backend's refusal, named back in the client's terms -----------------------


def test_a_backends_param_for_a_wire_field_is_named_where_the_client_put_it():
    tools = [{"type": "web_search_20250305", "name": "web_search"}, {"name": "weather", "input_schema": SCHEMA}]
    claude = anthropic(tools=tools, tool_choice={"type": "tool", "name": "weather"}).output()
    assert claude.client_param("tools[0].function.parameters.properties") == "tools[1].input_schema.properties"
    assert claude.client_param("tools[0]") == "tools[1]"
    codex = responses(tools=[{"type": "web_search"}, {"type": "function", "name": "weather"}],
                      text={"format": {"type": "json_object"}}).output()
    assert codex.client_param("response_format.json_schema") == "text.format"
    assert codex.client_param("tools[0].function.parameters") == "tools[1].parameters"
    plain = chat(tools=[CHAT_TOOL], response_format={"type": "json_object"}).output()
    for wire in ("response_format.json_schema", "tools[0].function.parameters", "tools[3]", "temperature"):
        assert plain.client_param(wire) == wire
