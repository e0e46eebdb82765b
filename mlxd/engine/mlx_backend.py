"""Which MLX backend is installed: exactly one per machine.

On Linux the ``mlx`` package is MLX's core only; its backend is a separate
distribution: ``mlx-cpu`` (``mlx[cpu]``, from ``mlxd[cpu]``) or
``mlx-cuda-12``/``mlx-cuda-13`` (``mlxd[cuda]``). With none, ``import
mlx.core`` fails with a linker error; with two, which one MLX loads is
whichever its loader finds first. ``mlxd serve`` checks before it starts and
says what to install. macOS needs nothing: ``mlx`` brings ``mlx-metal``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

LINUX_BACKENDS = ("mlx-cpu", "mlx-cuda-12", "mlx-cuda-13")


def installed_backends(names: Iterable[str] | None = None) -> list[str]:
    """The backend distributions present (``names``: installed distributions)."""
    if names is None:
        names = (d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    present = {n.lower().replace("_", "-") for n in names}
    return [b for b in LINUX_BACKENDS if b in present]


def backend_problem(platform: str, backends: list[str]) -> str | None:
    """What is wrong with the MLX install, in words a user can act on; None if fine."""
    if not platform.startswith("linux"):
        return None
    if not backends:
        return ("no MLX backend is installed: install mlxd with one, "
                "`pip install 'mlxd[cpu]'` (CPU) or `pip install 'mlxd[cuda]'` (NVIDIA), or run `make setup`")
    if len(backends) > 1:
        keep = "mlx-cuda-13" if "mlx-cuda-13" in backends else backends[-1]
        others = " ".join(b for b in backends if b != keep)
        return (f"{len(backends)} MLX backends are installed ({', '.join(backends)}); MLX would load "
                f"whichever it finds first. Keep one: `pip uninstall {others}`")
    return None
