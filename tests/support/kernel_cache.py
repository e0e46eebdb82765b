"""An empty MLX kernel cache for a daemon under test, and what gets compiled into it.

MLX keeps the CPU kernels it compiles on first use under ``$TMPDIR`` (and
CUDA's under ``MLX_PTX_CACHE_DIR``); a daemon started with ``env`` compiles
into ``root``, so a test can tell which of its requests compiled anything."""

from __future__ import annotations

from pathlib import Path


class KernelCache:
    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        self.env = {"TMPDIR": str(root), "MLX_PTX_CACHE_DIR": str(root / "ptx")}

    def compiled(self) -> set[str]:
        """The compiled CPU kernels' file names."""
        return {p.name for p in self.root.rglob("*.so")}
