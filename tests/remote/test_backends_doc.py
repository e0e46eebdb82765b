"""docs/backends.md stays true: both setups are there and their registry
examples load as written (with their key variables set)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from support.daemon import tiny_model

from mlxd.registry.loader import load_registry_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"


def examples() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(3))
def test_each_registry_example_loads(index, tmp_path):
    text = textwrap.dedent(examples()[index])  # those in numbered steps are indented
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "small").symlink_to(tiny_model("qwen"))
    registry = load_registry_text(text, tmp_path / "models.yaml", env={"STUDIO_KEY": "s", "TEAM_KEY": "t"})
    remote = [m for m in registry.models if m.backend]
    assert remote and all(registry.backend(m.backend) for m in remote)
    assert all(m.charge_bytes == 0 for m in remote)


def test_the_doc_has_both_setups_and_failover():
    assert len(examples()) == 3
    text = DOC.read_text()
    assert "## A laptop in front of a Mac Studio" in text and "## A team GPU server running vLLM" in text
    assert "## Failover" in text


def test_the_failover_example_is_one_name_over_a_local_model_and_the_studios():
    text = examples()[2]
    registry = load_registry_text(text, Path("/nonexistent/models.yaml"), env={"STUDIO_KEY": "s"})
    coder = registry.find("coder")
    assert coder.targets == ("small", "studio:qwen-coder") and coder.strategy == "warm"
