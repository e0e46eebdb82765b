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


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_load_unload_cycles_leave_no_memory_behind(worker, qwen_tiny):
    """A daemon loads and unloads models for weeks. Building a model draws its
    initial (then replaced) parameters from MLX's global random key, which
    MLX splits lazily: unless the key is evaluated, its graph grows by every
    draw of every load (~45 KB per tiny model, measured). Nor may any engine
    object outlive its unload."""
    import gc
    import weakref

    from engine.engine_support import spec_for

    from mlxd.engine.loader import load_text_engine

    spec = spec_for(qwen_tiny, "tiny")

    async def cycle() -> weakref.ref:
        engine = await load_text_engine(spec, worker)
        await engine.close()
        return weakref.ref(engine)

    # RSS is read after the first cycles have warmed the allocators up, and
    # after the last. A full collection only there: in a suite's worker, whose
    # heap holds every earlier test's objects, one per cycle took most of the time.
    warm, cycles = 15, 45

    async def main() -> tuple[list[int], list[weakref.ref]]:
        samples, refs = [], []
        for i in range(cycles):
            refs.append(await cycle())
            if i in (warm, cycles - 1):
                gc.collect()
                samples.append(_rss_bytes())
        return samples, refs

    (start, end), refs = run(main())
    gc.collect()
    assert [r for r in refs if r() is not None] == []
    # Well under the 45 KB a cycle that the random key alone used to keep.
    per_cycle = (end - start) / (cycles - 1 - warm)
    assert per_cycle < 12 * 1024, f"RSS grew {per_cycle / 1024:.1f} KB per load/unload cycle"
