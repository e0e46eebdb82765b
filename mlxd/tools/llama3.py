"""Llama 3.x tool calls: the whole answer is JSON, ``{"name": ..., "parameters": {...}}``.

mlx-lm has no parser for this family. Llama 3.2 may write several calls
separated by ``;``, and built-in tools come after ``<|python_tag|>``.
"""

from __future__ import annotations

import json
from typing import Any

PYTHON_TAG = "<|python_tag|>"


def parse_tool_call(text: str, tools: Any = None) -> dict[str, Any] | list[dict[str, Any]]:
    text = text.strip()
    if text.startswith(PYTHON_TAG):
        text = text[len(PYTHON_TAG) :]
    decoder = json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n;":
            pos += 1
        if pos >= len(text):
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Could not parse tool call from: {text}") from exc
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("parameters", value.get("arguments", {})) if isinstance(value, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise ValueError(f"Could not parse tool call from: {text}")
        calls.append({"name": name, "arguments": arguments})
    if not calls:
        raise ValueError("No function provided.")
    return calls[0] if len(calls) == 1 else calls
