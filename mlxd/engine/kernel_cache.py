"""Where MLX keeps the kernels it compiles, so a restarted daemon reuses them.

MLX's CUDA backend compiles kernels with NVRTC on first use and caches the
result on disk in ``$MLX_PTX_CACHE_DIR``, by default
``$TMPDIR/mlx/<version>/ptx`` (mlx/backend/cuda/jit_module.cpp): a temporary
folder that a reboot or a tmp cleaner empties, after which the first
requests pay the compilation again (13.9 s for a bench-size model's first
2k-token prompt on an H200; 0.8 s with a warm cache). mlxd points it at
``~/.cache/mlxd/kernels/mlx-<version>/ptx`` (``$XDG_CACHE_HOME`` is honoured,
``MLXD_KERNEL_CACHE_DIR`` replaces the base) unless the user has set
``MLX_PTX_CACHE_DIR`` already. The variable is read once, when MLX compiles
its first kernel, so it is set at process start, before MLX is imported.

Per MLX version, because a kernel compiled by one release need not match the
next one's sources. The CPU backend's kernels (``$TMPDIR/mlx/<version>/cpu``)
have no switch of their own; redirecting ``TMPDIR`` would move every other
temporary file too, so they stay where MLX puts them. Metal ships its kernels
precompiled.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

PTX_ENV = "MLX_PTX_CACHE_DIR"
BASE_ENV = "MLXD_KERNEL_CACHE_DIR"


def installed_mlx_version() -> str:
    try:
        return importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def kernel_cache_dir(env: Mapping[str, str], home: Path | None = None, mlx_version: str | None = None) -> Path:
    base = env.get(BASE_ENV)
    if not base:
        xdg = env.get("XDG_CACHE_HOME")
        base = str((Path(xdg) if xdg else (home or Path.home()) / ".cache") / "mlxd" / "kernels")
    return Path(base).expanduser() / f"mlx-{mlx_version or installed_mlx_version()}"


def kernel_cache_env(env: Mapping[str, str], home: Path | None = None,
                     mlx_version: str | None = None) -> dict[str, str]:
    """The variables to add to ``env``: empty when the user chose a folder."""
    if env.get(PTX_ENV):
        return {}
    return {PTX_ENV: str(kernel_cache_dir(env, home, mlx_version) / "ptx")}


def keep_kernels_in_mlxd_cache() -> dict[str, str]:
    """Set the variables in this process (call before ``import mlx``)."""
    added = kernel_cache_env(os.environ)
    os.environ.update(added)
    return added
