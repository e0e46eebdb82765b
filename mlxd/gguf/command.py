"""``mlxd import FILE.gguf [DIR] [--name NAME]``: the command's logic, so
the CLI stays a thin shell around it."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from mlxd.errors import GGUFError
from mlxd.gguf.convert import KEEP, import_gguf


def default_name(source: Path) -> str:
    """A registry name from the file name: ``SmolLM2-135M-Instruct.Q4_1.gguf``
    -> ``smollm2-135m-instruct-q4_1``."""
    stem = Path(source).name.removesuffix(".gguf")
    return re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-") or "model"


def run_import(source: Path, directory: Path | None, name: str | None,
               quantize_bits: int | None = None, dtype: str = KEEP) -> str:
    """Convert and return what to tell the user (where it went, how to serve it)."""
    source = Path(source).expanduser()
    if not source.is_file():
        raise GGUFError(f"{source} is not a file")
    name = name or default_name(source)
    target = (Path(directory).expanduser() if directory is not None else Path.cwd() / name).absolute()
    blocker = next((p for p in (target, *target.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise GGUFError(f"cannot make the folder {target}: {blocker} is a file, not a folder")
    try:
        import_gguf(source, target, quantize_bits=quantize_bits, dtype=dtype)
    finally:
        # The lock that serialises concurrent conversions is no file to leave
        # in the user's folder after a one-off import (where there is one:
        # a folder that could not be made has none, and its error is the one to tell).
        with contextlib.suppress(OSError):
            (target.parent / f".{target.name}.lock").unlink(missing_ok=True)
    return "\n".join([
        f"imported {source} into {target}",
        "add it to models.yaml:",
        f"  - name: {name}",
        f"    path: {target}",
    ])
