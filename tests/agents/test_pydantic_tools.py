"""A Pydantic-generated nested tool (``$defs`` / ``$ref``) forced through
every surface with its official client: chat completions, Anthropic
Messages and Responses each return a call that the Pydantic model itself
validates (it was a 400 "Pointer '/$defs/...' does not exist")."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from support.daemon import daemon_in_thread, tiny_model, write_registry
from tools.tool_models import pydantic_tools, with_template

pytestmark = pytest.mark.mlx

TOOLS, MODELS = pydantic_tools()
ORDER = TOOLS[0]["function"]
ASK = "Send a tea to Paris."


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pydantic-tools")
    tooly = with_template(tiny_model("qwen"), tmp / "qwen-tools")
    registry = write_registry(tmp, [{"name": "tooly", "path": str(tooly), "max_concurrency": 2}])
    with daemon_in_thread(registry, tmp) as d:
        yield d


def _valid(name: str, arguments: str | dict) -> None:
    assert name == "place_order"
    MODELS[name].model_validate(json.loads(arguments) if isinstance(arguments, str) else arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions(daemon, stream):
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", max_retries=0)
    ask = dict(model="tooly", messages=[{"role": "user", "content": ASK}], tools=TOOLS, max_tokens=160,
               tool_choice={"type": "function", "function": {"name": "place_order"}})
    if not stream:
        (call,) = client.chat.completions.create(**ask).choices[0].message.tool_calls
        _valid(call.function.name, call.function.arguments)
        return
    name, arguments = "", ""
    for chunk in client.chat.completions.create(**ask, stream=True):
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name += delta.function.name or ""
            arguments += delta.function.arguments or ""
    _valid(name, arguments)


def test_anthropic_messages(daemon):
    client = anthropic.Anthropic(base_url=daemon.url, api_key="none", max_retries=0)
    reply = client.messages.create(
        model="tooly", max_tokens=160, messages=[{"role": "user", "content": ASK}],
        tools=[{"name": ORDER["name"], "description": ORDER["description"], "input_schema": ORDER["parameters"]}],
        tool_choice={"type": "tool", "name": "place_order"},
    )
    assert reply.stop_reason == "tool_use"
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    _valid(block.name, block.input)


def test_responses(daemon):
    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="none", max_retries=0)
    response = client.responses.create(
        model="tooly", input=ASK, max_output_tokens=160, store=False,
        tools=[{"type": "function", "name": ORDER["name"], "parameters": ORDER["parameters"], "strict": False}],
        tool_choice={"type": "function", "name": "place_order"},
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    _valid(call.name, call.arguments)
