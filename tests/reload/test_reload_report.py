"""What the reload report says about renames, with and without the engine kept."""

from pathlib import Path

from mlxd.daemon.reload import _model_outcomes
from mlxd.registry.diff import diff_registries
from mlxd.registry.model import ManagerSpec, ModelSpec, Registry, ServerSpec


def registry(*names: str) -> Registry:
    models = tuple(ModelSpec(name=n, path=Path("/models/same"), source="/models/same") for n in names)
    return Registry(None, "h", ManagerSpec(memory_budget_bytes=1 << 30), ServerSpec(), models)


def test_a_rename_that_keeps_its_engine_is_reported_as_renamed():
    diff = diff_registries(registry("old"), registry("new"))
    outcomes = _model_outcomes(diff, [], {"old": "new"})
    assert outcomes["new"]["change"] == "renamed" and outcomes["new"]["renamed_from"] == "old"
    assert "old" not in outcomes


def test_a_rename_caught_mid_load_is_reported_as_removed_and_added():
    diff = diff_registries(registry("old"), registry("new"))
    outcomes = _model_outcomes(diff, [], {})
    assert outcomes["new"]["change"] == "added" and "renamed_from" not in outcomes["new"]
    assert outcomes["old"]["change"] == "removed"
