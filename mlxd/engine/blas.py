"""Which BLAS MLX runs on, and preloading OpenBLAS on Linux.

The ``mlx[cpu]`` wheel for Linux vendors the reference Netlib BLAS
(``mlx_cpu.libs/libblas-*.so``): f32 matmul runs at 2–3 GFLOP/s. Debian's
OpenBLAS (``apt-get install libopenblas0-pthread``) exports the same symbols
and, when it is in ``LD_PRELOAD``, the dynamic linker resolves MLX's BLAS
calls to it first: 60–190 GFLOP/s, identical results. ``LD_PRELOAD`` only
works if it is set before the process starts, so ``mlxd serve`` asks
:func:`preload_env` for an environment and re-executes itself with it.

``MLXD_BLAS=bundled`` turns the preload off (``auto``, the default, preloads
whenever OpenBLAS is installed).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError

OPENBLAS = "openblas"
BUNDLED = "mlx-bundled reference BLAS"
ACCELERATE = "accelerate"
NOT_LOADED = "not loaded"

ENV_SWITCH = "MLXD_BLAS"
MODES = ("auto", "bundled")

_DEBIAN_OPENBLAS = (
    Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0"),
    Path("/usr/lib/aarch64-linux-gnu/libopenblas.so.0"),
)
# Debian's library is libopenblas.so.0 -> libopenblasp-r0.3.21.so. numpy's
# wheel maps its own ``libscipy_openblas64_`` with renamed symbols, which
# MLX never calls, so it must not count.
_OPENBLAS_NAME = re.compile(r"^libopenblas[^/]*\.so")
_MLX_BUNDLED_NAME = re.compile(r"^libblas[^/]*\.so")


def blas_mode(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    mode = env.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ConfigError(
            f"must be one of {', '.join(MODES)}, got {mode!r}", file="environment", key=ENV_SWITCH
        )
    return mode


def find_openblas() -> Path | None:
    """Debian's OpenBLAS shared library, if installed (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    for candidate in _DEBIAN_OPENBLAS:
        if candidate.exists():
            return candidate
    return _ldconfig_lookup("libopenblas.so.0")


def _ldconfig_lookup(soname: str) -> Path | None:
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if ldconfig is None:
        return None
    try:
        listing = subprocess.run(
            [ldconfig, "-p"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    machine = os.uname().machine.replace("_", "-")  # "x86-64", "aarch64"
    fallback = None
    for line in listing.splitlines():
        name, _, path = line.strip().partition(" => ")
        if not name.startswith(soname) or not path:
            continue
        if machine in name:
            return Path(path)
        fallback = fallback or Path(path)
    return fallback


def preload_env(env: Mapping[str, str]) -> dict[str, str] | None:
    """``env`` with OpenBLAS in ``LD_PRELOAD``, or None if no re-exec is needed.

    None when: not Linux, ``MLXD_BLAS=bundled``, OpenBLAS is not installed, or
    an OpenBLAS is already in ``LD_PRELOAD`` (so a re-exec'd process never
    loops, even if the preload did not take).
    """
    if not sys.platform.startswith("linux") or blas_mode(env) == "bundled":
        return None
    library = find_openblas()
    if library is None:
        return None
    current = env.get("LD_PRELOAD", "")
    entries = [e for e in re.split(r"[:\s]+", current) if e]
    if any(_OPENBLAS_NAME.match(os.path.basename(e)) for e in entries):
        return None
    new_env = dict(env)
    new_env["LD_PRELOAD"] = ":".join([str(library), *entries])
    return new_env


def mapped_libraries() -> list[str]:
    """Paths of the shared objects mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            # address perms offset dev inode [path]; anonymous mappings have no path.
            fields = (line.split(maxsplit=5) for line in maps)
            paths = {f[5].strip() for f in fields if len(f) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if ".so" in os.path.basename(p))


def active_blas() -> str:
    """The BLAS MLX's matmuls actually run on in this process.

    MLX calls ``cblas_sgemm``. The dynamic linker binds it to the first
    definition in the process's global scope (the program, ``LD_PRELOAD``,
    ``RTLD_GLOBAL`` libraries) and only then to MLX's own dependency, the
    bundled ``libblas``. So: whoever defines it globally wins; otherwise it is
    the bundled one if ``/proc/self/maps`` shows it mapped. Imports
    ``mlx.core`` first, since the answer only exists once MLX is mapped.
    """
    if sys.platform == "darwin":
        return ACCELERATE
    import mlx.core  # noqa: F401 - maps MLX and its bundled BLAS

    provider = global_symbol_library("cblas_sgemm")
    if provider is not None:
        if _is_openblas(provider):
            return OPENBLAS
        return f"system BLAS ({os.path.basename(provider)})"
    names = [os.path.basename(p) for p in mapped_libraries()]
    if any(_MLX_BUNDLED_NAME.match(n) for n in names):
        return BUNDLED
    return NOT_LOADED


def _is_openblas(path: str) -> bool:
    # Debian ships OpenBLAS both as libopenblas.so.0 and, through the
    # alternatives system, as .../openblas-pthread/libblas.so.3.
    return bool(_OPENBLAS_NAME.match(os.path.basename(path))) or "/openblas" in path


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def global_symbol_library(symbol: str) -> str | None:
    """The file that defines ``symbol`` in the global scope, or None."""
    try:
        scope = ctypes.CDLL(None)
        address = ctypes.cast(getattr(scope, symbol), ctypes.c_void_p).value
        dladdr = scope.dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    path = info.dli_fname.decode(errors="replace")
    return os.path.realpath(path) if os.path.exists(path) else path


def blas_report(env: Mapping[str, str] | None = None, device_kind: str | None = None) -> dict[str, Any]:
    """What /health and the startup log say about BLAS.

    The slow-BLAS warning is for the CPU backend only: on CUDA matrix
    products run on the GPU (cuBLAS), whatever BLAS the host process maps.
    """
    env = os.environ if env is None else env
    mode = blas_mode(env)
    active = active_blas()
    openblas = find_openblas()
    if device_kind is None:
        from mlxd.registry.device import current_device

        device_kind = current_device().kind
    warning = None
    if sys.platform.startswith("linux") and active != OPENBLAS and device_kind == "cpu":
        if openblas is None:
            fix = "install Debian's OpenBLAS (apt-get install libopenblas0-pthread) and restart"
        elif mode == "bundled":
            fix = f"unset {ENV_SWITCH}=bundled and restart with `mlxd serve`"
        else:
            fix = f"start the daemon with `mlxd serve` or LD_PRELOAD={openblas}"
        warning = (
            "MLX is running on its bundled reference BLAS: float32 matrix products are "
            f"20-60x slower than with OpenBLAS. To fix: {fix}."
        )
    return {
        "active": active,
        "mode": mode,
        "openblas_path": str(openblas) if openblas else None,
        "ld_preload": env.get("LD_PRELOAD") or None,
        "warning": warning,
    }
