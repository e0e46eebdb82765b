"""Measuring MLX memory and giving it back to the OS after an unload.

Every function here touches MLX and must run on the worker thread.

Why ``release_memory`` does more than ``gc.collect()``: after a model's last
reference is gone, MLX can still hold part of its buffers until the pending
work on mlx-lm's generation stream is synchronised, and freed buffers stay in
MLX's cache until ``clear_cache``. Then glibc keeps the freed heap pages
mapped; ``malloc_trim(0)`` hands them back (measured: RSS 1.48 GB -> ~90 MB
after unloading a 2 GB model). And MLX's global random key is evaluated, so
the lazy splits of it that every model build makes do not pile up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from functools import cache
from typing import Any


def mlx_memory() -> dict[str, int]:
    """MLX's own allocator figures, in bytes."""
    import mlx.core as mx

    return {
        "active": int(mx.get_active_memory()),
        "peak": int(mx.get_peak_memory()),
        "cache": int(mx.get_cache_memory()),
    }


def active_bytes() -> int:
    import mlx.core as mx

    return int(mx.get_active_memory())


def peak_bytes() -> int:
    import mlx.core as mx

    return int(mx.get_peak_memory())


def reset_peak() -> None:
    import mlx.core as mx

    mx.reset_peak_memory()


def synchronize_generation() -> None:
    """Wait for pending work on mlx-lm's generation stream (and the default one)."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    mx.synchronize(generation_stream)
    mx.synchronize()


def release_memory() -> dict[str, Any]:
    """Free what unreferenced models left behind; returns figures before and after."""
    import mlx.core as mx

    before = mlx_memory()
    gc.collect()
    synchronize_generation()
    settle_random_key()
    mx.clear_cache()
    trimmed = malloc_trim()
    after = mlx_memory()
    return {"before": before, "after": after, "malloc_trim": trimmed}


def settle_random_key() -> None:
    """Evaluate MLX's global random key.

    Every random draw splits that key lazily, so until something evaluates
    it, the key's graph keeps every split since. Building a model draws its
    initial parameters from it, and a load replaces them with the weights
    before they are ever evaluated: without this, each load/unload cycle kept
    ~45 KB (measured with a tiny model; bench/load_cycles.py).
    """
    import mlx.core as mx

    mx.eval(mx.random.state)


def malloc_trim() -> bool:
    """Give glibc's free heap pages back to the OS; False where there is no glibc."""
    trim = _malloc_trim_function()
    if trim is None:
        return False
    trim(0)
    return True


@cache
def _malloc_trim_function() -> Any:
    # A read-only lookup of a C function: safe to cache for the process.
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # absent on musl
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim
