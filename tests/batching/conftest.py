"""Fixtures for the batching tests: the engine tests' worker and tiny models,
a batching engine (max_concurrency 8) and a single-path one (max_concurrency 1)
over the same weights, for reference outputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine.conftest import llama_tiny, qwen_tiny, worker  # noqa: F401 - shared fixtures
from engine.engine_support import run, spec_for
from prefix_cache.conftest import qwen_small  # noqa: F401 - shared fixture

from mlxd.engine.loader import load_text_engine
from mlxd.engine.text import TextEngine
from mlxd.engine.worker import MlxWorker


@pytest.fixture
def batched(worker: MlxWorker, qwen_tiny: Path) -> Iterator[TextEngine]:  # noqa: F811
    engine = run(load_text_engine(spec_for(qwen_tiny, "batched", max_concurrency=8), worker))
    assert engine.stats()["batching"]
    yield engine
    run(engine.close())


@pytest.fixture
def single(worker: MlxWorker, qwen_tiny: Path) -> Iterator[TextEngine]:  # noqa: F811
    engine = run(load_text_engine(spec_for(qwen_tiny, "single", max_concurrency=1), worker))
    assert not engine.stats()["batching"]
    yield engine
    run(engine.close())
