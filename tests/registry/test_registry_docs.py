"""The reference and the example file document every key the schema accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from mlxd.registry.schema import (
    VLLM_MLX_IGNORED_MODEL_KEYS,
    BackendSection,
    ContentionSection,
    ManagerSection,
    ModelEntry,
    PrefixCacheSection,
    SamplingSection,
    ServerSection,
    TimeoutsSection,
)

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    ServerSection,
    ManagerSection,
    ContentionSection,
    PrefixCacheSection,
    ModelEntry,
    SamplingSection,
    BackendSection,
    TimeoutsSection,
]
# vllm-mlx spellings: documented in the reference's mapping, not in our example.
VLLM_MLX_ONLY = {
    ManagerSection: {"memory_budget_gb", "idle_unload_seconds"},
    ModelEntry: {"source", "model", "mllm", *VLLM_MLX_IGNORED_MODEL_KEYS},
}


def keys(section: type[BaseModel]) -> list[str]:
    return list(section.model_fields)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_reference_documents_every_key(section):
    doc = (ROOT / "docs" / "registry.md").read_text()
    missing = [k for k in keys(section) if not re.search(rf"`([\w.\[\]]+\.)?{k}\b", doc)]
    assert missing == []


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_example_file_shows_every_native_key(section):
    example = (ROOT / "models.yaml.example").read_text()
    written = set(re.findall(r"^\s*(?:- )?(\w+):", example, flags=re.M))
    native = [k for k in keys(section) if k not in VLLM_MLX_ONLY.get(section, set())]
    assert [k for k in native if k not in written] == []
