"""``serve`` starts again with OpenBLAS preloaded (LD_PRELOAD only takes at
process start)."""

from __future__ import annotations

import os
import sys


def reexec_with_openblas() -> None:
    """Start this command again with OpenBLAS in LD_PRELOAD, unless it is
    there already or not wanted (see ``preload_env``); returns if not."""
    from mlxd.engine.blas import preload_env

    env = preload_env(os.environ)
    if env is not None:
        os.execve(sys.executable, [sys.executable, "-m", "mlxd", *sys.argv[1:]], env)
