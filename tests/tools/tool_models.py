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
