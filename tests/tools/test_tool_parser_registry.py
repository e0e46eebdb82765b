"""The registry's ``tool_parser:`` key and what ``mlxd check`` says about tool calls."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.check import describe
from mlxd.registry.loader import load_registry_text


def registry(tmp_path: Path, models: str):
    text = "manager:\n  memory_budget: 1GB\nmodels:\n" + textwrap.indent(textwrap.dedent(models), "  ")
    return load_registry_text(text, tmp_path / "models.yaml")


def test_check_shows_the_guessed_format_the_override_the_default_and_off(tmp_path, qwen_tiny, hermes_tiny):
    reg = registry(tmp_path, f"""\
        - name: plain
          path: {qwen_tiny}
        - name: hermes
          path: {hermes_tiny}
        - name: coder
          path: {qwen_tiny}
          tool_parser: qwen3_coder
        - name: quiet
          path: {hermes_tiny}
          tool_parser: none
        """)
    lines = describe(reg).splitlines()

    def tool_line(model):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  {model} ["))
        return next(line for line in lines[start:] if "tool calls:" in line).strip()

    # The factory's plain ChatML template names no format and renders no tools.
    assert tool_line("plain") == (
        "tool calls: json_tools (mlxd's default: the chat template names no format); "
        "the chat template has no place for tools, so mlxd writes them into the system prompt in json_tools markup"
    )
    assert tool_line("hermes") == "tool calls: json_tools (guessed from the chat template)"
    assert tool_line("coder") == (
        "tool calls: qwen3_coder (tool_parser:); "
        "the chat template has no place for tools, so mlxd writes them into the system prompt in json_tools markup"
    )
    assert tool_line("quiet") == "tool calls: off (tool_parser: none)"
    assert reg.lookup("coder").tool_parser == "qwen3_coder"


def test_an_unknown_parser_names_file_line_and_key(tmp_path, qwen_tiny):
    with pytest.raises(ConfigError) as info:
        registry(tmp_path, f"""\
            - name: plain
              path: {qwen_tiny}
              tool_parser: hermes2
            """)
    error = info.value
    assert error.key == "models[0].tool_parser"
    assert error.line == 6
    assert "hermes2" in str(error) and "json_tools" in str(error)


def test_changing_the_parser_reloads_the_model(tmp_path, qwen_tiny):
    before = registry(tmp_path, f"- name: m\n  path: {qwen_tiny}\n").lookup("m")
    after = registry(tmp_path, f"- name: m\n  path: {qwen_tiny}\n  tool_parser: mistral\n").lookup("m")
    assert after.needs_reload_from(before)
