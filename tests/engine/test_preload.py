"""The daemon imports the engines' libraries at start-up, off the request
path, then hides what start-up built from the garbage collector."""

from __future__ import annotations

import subprocess
import sys

from mlxd.engine.preload import modules_for

# It leaves as `mlxd serve` does (mlxd/cli/main.py): MLX's C++ teardown at
# interpreter exit, after a thread used it, can abort ("terminate called
# without an active exception"; 7 exits in 12 here), which is not what this checks.
PROBE = """
import gc, os, sys
from mlxd.engine.preload import StartupImports
imports = StartupImports()
imports.wait()  # nothing started: returns at once
before = gc.get_freeze_count()
imports.start(["text"])
imports.wait()
print("mlx_lm" in sys.modules, before, gc.get_freeze_count(), flush=True)
os._exit(0)
"""


def test_the_libraries_each_kind_needs():
    assert modules_for(["text", "text"]) == ("mlx_lm",)
    assert modules_for(["vision", "text"]) == ("mlx_vlm", "mlx_lm")
    assert modules_for(["remote"]) == ()


def test_start_up_imports_mlx_lm_and_freezes_what_it_built():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported, before, after = done.stdout.split()
    assert imported == "True"
    # Full collections no longer walk start-up's objects (transformers alone is tens of thousands).
    assert int(before) == 0 and int(after) > 20_000
