"""Fixtures for the engine tests: a fresh worker per test and real tiny models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine.engine_support import run, spec_for

from mlxd.engine.text import TextEngine
from mlxd.engine.worker import MlxWorker


@pytest.fixture
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


@pytest.fixture(scope="session")
def qwen_tiny() -> Path:
    from mlxd.factory import ModelRecipe, build_model

    return build_model(ModelRecipe(arch="qwen2", size="tiny"))


@pytest.fixture(scope="session")
def llama_tiny() -> Path:
    from mlxd.factory import ModelRecipe, build_model

    return build_model(ModelRecipe(arch="llama", size="tiny"))


@pytest.fixture
def engine(worker: MlxWorker, qwen_tiny: Path) -> Iterator[TextEngine]:
    from mlxd.engine.loader import load_text_engine

    eng = run(load_text_engine(spec_for(qwen_tiny, "qwen-tiny"), worker))
    yield eng
    run(eng.close())
