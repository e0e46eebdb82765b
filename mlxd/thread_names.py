"""The kernel's name for the current thread: the Python thread's.

Python 3.11 names no thread for the kernel, so ``top -H``, ``ps -L``,
``/proc/PID/task/*/comm`` and a crash report show every thread of the daemon
as ``python``, and telling the MLX worker from an encoder's pass thread took
a profiler that attaches to the process (py-spy). Each thread the daemon
starts names itself with this first; the main thread (the event loop) keeps
the process's name. Linux keeps 15 bytes of a name, macOS 63. A thread
starts with its creator's name, so the BLAS and MLX threads the worker
starts read "mlx-worker" too.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

_PR_SET_NAME = 15


@functools.cache
def _libc() -> ctypes.CDLL:
    # One handle: a new CDLL a call kept ~100 bytes of each thread's naming.
    return ctypes.CDLL(None)


def name_this_thread(name: str | None = None) -> None:
    """Give the calling thread ``name`` (its Python name by default) in the
    kernel. Best effort: a platform without the call keeps the old name."""
    raw = (name or threading.current_thread().name).encode("utf-8", "replace")
    try:
        libc = _libc()
        if sys.platform.startswith("linux"):
            libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw[:15]), 0, 0, 0)
        elif sys.platform == "darwin":
            libc.pthread_setname_np(ctypes.c_char_p(raw[:63]))
    except (OSError, AttributeError):
        pass
