"""Fixtures for the vision tests: the tiny vision model and a worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vision.vision_support import tiny_vision_model

from mlxd.engine.worker import MlxWorker


@pytest.fixture(scope="session")
def vision_tiny() -> Path:
    return tiny_vision_model()


@pytest.fixture
def worker() -> Iterator[MlxWorker]:
    import asyncio

    w = MlxWorker().start()
    yield w
    asyncio.run(w.shutdown())
