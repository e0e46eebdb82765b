"""Tools for a model whose chat template has no place for them.

Many chat templates (SmolLM2's, plain ChatML, Llama 2's) never mention
``tools``: handed a tool list, they drop it, and an assistant turn's
``tool_calls`` and the ``tool`` turns after it vanish or render as bare
roles. Agents send tools on every request, so such a model would answer as
if it had none. mlxd then writes the conversation in the Hermes / Qwen 2.5
convention itself, as plain text the template can render: the tool list in
the system turn inside ``<tools>``, each earlier call as ``<tool_call>`` JSON
in its assistant turn, each result as a user turn inside
``<tool_response>``. That is the markup the ``json_tools`` parser reads back,
mlxd's default format for a template that names none (docs/tools.md).

Pure functions of messages and tools; ``engine/prompt.py`` calls them before
the template.
"""

from __future__ import annotations

import json
from typing import Any

_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_INSTRUCTIONS = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def renders_tools(template: Any) -> bool:
    """Whether a chat template (a string, or a list of named ones) can render a tool list."""
    if isinstance(template, list):
        return any(renders_tools(t.get("template") if isinstance(t, dict) else t) for t in template)
    return isinstance(template, str) and "tools" in template


def needs_folding(messages: list[dict[str, Any]], tools: Any) -> bool:
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def fold(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` (content already one string, call arguments parsed) with
    the tools, calls and results written into the text of plain turns."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            response = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_responses"):
                # Results of one assistant turn's calls share one user turn, as Qwen's template renders them.
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response, "_tool_responses": True})
        elif role == "assistant" and message.get("tool_calls"):
            calls = [_call_text(c) for c in message["tool_calls"]]
            text = message.get("content") or ""
            out.append({"role": "assistant", "content": "\n".join([text, *calls] if text else calls)})
        else:
            out.append(dict(message))
    for message in out:
        message.pop("_tool_responses", None)
    if tools:
        listing = _PREAMBLE + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _INSTRUCTIONS
        if out and out[0].get("role") == "system":
            system = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{system}\n\n{listing}" if system else listing}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
