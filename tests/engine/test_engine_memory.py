"""MLX memory figures and giving freed memory back."""

from __future__ import annotations

import sys

import pytest
from engine.engine_support import run

from mlxd.engine import memory

pytestmark = pytest.mark.mlx


def test_release_memory_empties_mlx_cache_after_arrays_are_dropped(worker):
    def allocate_then_drop() -> tuple[dict[str, int], dict]:
        import mlx.core as mx

        block = mx.ones((1024, 1024))  # 4 MB
        mx.eval(block)
        held = memory.mlx_memory()
        del block
        return held, memory.release_memory()

    held, released = run(worker.call(allocate_then_drop))
    assert held["active"] >= 4 * 1024 * 1024
    assert held["active"] - released["after"]["active"] >= 4 * 1024 * 1024 - 1024
    assert released["after"]["cache"] == 0
    assert released["malloc_trim"] == sys.platform.startswith("linux")


def test_reset_peak_starts_a_new_measurement(worker):
    def measure() -> tuple[int, int]:
        import mlx.core as mx

        block = mx.ones((512, 512))
        mx.eval(block)
        del block
        before = memory.peak_bytes()
        memory.reset_peak()
        return before, memory.peak_bytes()

    before, after = run(worker.call(measure))
    assert before >= 512 * 512 * 4
    assert after < before
