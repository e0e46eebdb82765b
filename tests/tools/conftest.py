"""Fixtures for the tool-calling and constrained-decoding tests: real tiny models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine.engine_support import run, spec_for
from tools.tool_models import with_template

from mlxd.engine.text import TextEngine
from mlxd.engine.worker import MlxWorker


@pytest.fixture(scope="module")
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


@pytest.fixture(scope="session")
def qwen_tiny() -> Path:
    from mlxd.factory import ModelRecipe, build_model

    return build_model(ModelRecipe(arch="qwen2", size="tiny"))


@pytest.fixture(scope="session")
def hermes_tiny(qwen_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a Qwen 2.5-style tool template."""
    return with_template(qwen_tiny, tmp_path_factory.mktemp("hermes") / "model")


def _engine(worker: MlxWorker, path: Path, name: str, **overrides) -> Iterator[TextEngine]:
    from mlxd.engine.loader import load_text_engine

    eng = run(load_text_engine(spec_for(path, name, **overrides), worker))
    yield eng
    run(eng.close())


@pytest.fixture(scope="module")
def single(worker: MlxWorker, qwen_tiny: Path) -> Iterator[TextEngine]:
    """One request at a time (stream_generate)."""
    yield from _engine(worker, qwen_tiny, "single")


@pytest.fixture(scope="module")
def batched(worker: MlxWorker, qwen_tiny: Path) -> Iterator[TextEngine]:
    """Continuous batching (BatchGenerator), up to 4 rows."""
    yield from _engine(worker, qwen_tiny, "batched", max_concurrency=4)


@pytest.fixture(scope="module")
def hermes(worker: MlxWorker, hermes_tiny: Path) -> Iterator[TextEngine]:
    yield from _engine(worker, hermes_tiny, "hermes", max_concurrency=2)
