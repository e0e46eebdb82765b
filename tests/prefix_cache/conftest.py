"""Fixtures for the prefix cache tests: the engine tests' worker and tiny
models, plus a model whose KV cache can be quantised."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine.conftest import llama_tiny, qwen_tiny, worker  # noqa: F401 - shared fixtures

from mlxd.factory import ModelRecipe, build_model


@pytest.fixture(scope="session")
def qwen_small() -> Path:
    """Head size 64: the smallest factory model a quantised KV cache (group 64) fits."""
    return build_model(ModelRecipe(arch="qwen2", size="small"))
