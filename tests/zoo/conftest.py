"""Fixtures for the zoo tests: one mlxd daemon (a separate process, as a user
runs it) serving every zoo family, shared by all paths of all families.

Each text family is served twice over the same weights: ``NAME`` on the
single-request path (max_concurrency 1) and ``NAME-batch`` on the batching
path (max_concurrency 4). The references (plain mlx-lm / mlx-vlm) run in the
test process, which the daemon's MLX work never shares.

Other lanes' zoo paths (prefix cache turns, persistence, thinking) reuse
``zoo_daemon`` and ``zoo_model`` per family.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon import Daemon, daemon_process
from zoo.zoo_support import FAMILIES, TEXT_FAMILIES, References, registry_entries, zoo_model


@pytest.fixture(scope="session")
def zoo_paths() -> dict[str, Path]:
    """Every family's folder, built once (seconds the first time, then cached)."""
    return {name: zoo_model(name) for name in FAMILIES}


@pytest.fixture(scope="session")
def reference(zoo_paths: dict[str, Path]) -> References:
    return References(zoo_paths)


@pytest.fixture(scope="session")
def zoo_daemon(zoo_paths: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    import yaml

    root = tmp_path_factory.mktemp("zoo")
    registry = root / "models.yaml"
    doc = {
        "manager": {"memory_budget": "4GB", "cache_dir": str(root / "cache")},
        "models": registry_entries(zoo_paths),
    }
    registry.write_text(yaml.safe_dump(doc, sort_keys=False))
    with daemon_process(registry, root) as daemon:
        yield daemon


@pytest.fixture(params=TEXT_FAMILIES)
def text_family(request: pytest.FixtureRequest) -> str:
    return request.param
