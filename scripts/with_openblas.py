"""Runs a command with Debian's OpenBLAS preloaded, as `mlxd serve` runs itself.

    python scripts/with_openblas.py -m pytest ...

The tests run MLX in the test process (daemons in a thread, direct mlx-lm
calls beside them), and MLX's Linux CPU wheel brings the reference BLAS:
float32 matrix products there are 5-20x slower, and the suite took twice as
long. ``LD_PRELOAD`` only works at process start, so this sets it and
executes the interpreter again with the same arguments; pytest-xdist's
workers inherit it. Where there is nothing to preload (macOS, a Linux
machine without libopenblas0, ``MLXD_BLAS=bundled``) it runs the command as
it is. One BLAS thread per process: the parallelism is xdist's workers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlxd.engine.blas import preload_env  # noqa: E402


def main(argv: list[str]) -> None:
    env = preload_env(os.environ) or dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.execve(sys.executable, [sys.executable, *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
