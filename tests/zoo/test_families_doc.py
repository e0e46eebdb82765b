"""docs/families.md is what the zoo table says, and the table says nothing
the zoo tests do not check."""

from __future__ import annotations

from mlxd.factory.zoo import FAMILIES, PATHS
from mlxd.factory.zoo_doc import PAGE, render
from mlxd.factory.zoo_files import template_text
from mlxd.tools.fallback import renders_tools


def test_the_committed_families_page_is_the_table_rendered():
    assert PAGE.read_text(encoding="utf-8") == render(), "run `python -m mlxd.factory.zoo_doc` and commit docs/families.md"


def test_every_refusal_in_the_table_names_a_tested_path():
    for family in FAMILIES.values():
        assert set(family.unsupported) <= set(PATHS), family.name
        # A forced call needs a parser; a family without one must say so for both
        # (gpt-oss's harmony calls are parsed by mlxd itself, not by mlx-lm, and a
        # template with no place for tools gets mlxd's json_tools: docs/tools.md).
        if family.tool_parser is None and family.name != "gpt_oss" and renders_tools(template_text(family)):
            assert {"tools", "forced_tool"} <= set(family.unsupported), family.name
