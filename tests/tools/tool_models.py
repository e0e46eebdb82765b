"""Tiny factory models whose chat template has tools (imported as ``tools.tool_models``).

The factory's own template is plain ChatML. A copy of the model folder with
a Qwen 2.5-style template (tools in the system turn, calls as
``<tool_call>`` JSON, results as ``<tool_response>``) is what a real Hermes /
Qwen checkpoint ships, and mlx-lm infers its ``json_tools`` parser from it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\nFor each function "
    "call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '\\n<|im_start|>assistant\\n' + message.content }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '\\n<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>' }}"
    "{%- else %}{{- '\\n<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '\\n<|im_start|>assistant\\n' }}{%- endif %}"
)


def with_template(model_dir: Path, out: Path, template: str = QWEN_TOOLS_TEMPLATE) -> Path:
    """A copy of ``model_dir`` whose chat template is ``template``."""
    if not out.exists():
        shutil.copytree(model_dir, out)
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config["chat_template"] = template
        config_file.write_text(json.dumps(config, indent=2))
    return out


# Nested Pydantic models, as Python tool frameworks and MCP servers declare
# tools: their JSON schema keeps each nested model under ``$defs`` and points
# at it with ``$ref`` (``#/$defs/Address``). Bounded everywhere so that a
# random-weight model under the grammar finishes well inside max_tokens.
def _order_model() -> type:
    from typing import Literal

    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: Literal["Paris", "Rome", "Oslo"]
        floor: int = Field(ge=0, le=9)

    class Order(BaseModel):
        item: Literal["tea", "coffee"]
        ship_to: Address
        also_to: list[Address] = Field(max_length=2)

    return Order


def _refund_model() -> type:
    from pydantic import BaseModel, Field

    class Address(BaseModel):  # another tool's own Address, of another shape
        zip: int = Field(ge=1000, le=9999)

    class Refund(BaseModel):
        order: int = Field(ge=0, le=99)
        back_to: Address

    return Refund


def pydantic_tools() -> tuple[list[dict], dict[str, type]]:
    """Two tools in OpenAI chat's shape, each with its own ``$defs`` (both
    name an ``Address``), and the Pydantic models that validate their calls."""
    models = {"place_order": _order_model(), "refund": _refund_model()}
    tools = [
        {"type": "function", "function": {"name": name, "description": model.__name__,
                                          "parameters": model.model_json_schema()}}
        for name, model in models.items()
    ]
    return tools, models
