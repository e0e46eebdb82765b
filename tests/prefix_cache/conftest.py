"""Fixtures for the prefix cache tests: a fresh worker per test, real tiny models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prefix_cache.cache_support import run

from mlxd.engine.worker import MlxWorker
from mlxd.factory import ModelRecipe, build_model


@pytest.fixture
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


@pytest.fixture(scope="session")
def qwen_tiny() -> Path:
    return build_model(ModelRecipe(arch="qwen2", size="tiny"))


@pytest.fixture(scope="session")
def llama_tiny() -> Path:
    return build_model(ModelRecipe(arch="llama", size="tiny", seed=1))


@pytest.fixture(scope="session")
def qwen_small() -> Path:
    """Head size 64: the smallest factory model a quantised KV cache (group 64) fits."""
    return build_model(ModelRecipe(arch="qwen2", size="small"))
