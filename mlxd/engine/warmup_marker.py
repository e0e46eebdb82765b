"""A note, beside the compiled kernels, that a model's warm-up completed there.

Whether the loader warms a model before handing it over depends on whether
the warm-up will be fast (``mlxd.engine.warmup.decide_mode``): it is when
the kernels its plan compiles are already in the backend's on-disk kernel
cache. After a warm-up completes, the loader writes a marker file named by a
key of what decides those kernels: the model's ``config.json``
(architecture, sizes, quantisation), the dtypes of its loaded weights, the
KV quantisation, whether it batches, the warm-up plan (the shapes) and the
device. The marker lives *inside* the kernel cache folder
(``<folder>/mlxd-warmed/<key>``): a reboot, a tmp cleaner or a user who
empties the folder removes the markers with the kernels they vouch for.

- CUDA: ``$MLX_PTX_CACHE_DIR`` (``mlxd.engine.kernel_cache`` sets it), else
  MLX's default ``$TMPDIR/mlx/<version>/ptx``;
- CPU: ``$TMPDIR/mlx/<version>/cpu``, where MLX keeps its compiled CPU kernels;
- Metal: none (its kernels ship precompiled).

A marker that cannot be read or written is a miss (a background warm-up),
never a failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlxd.engine.kernel_cache import PTX_ENV, installed_mlx_version
from mlxd.files import read_json_object

log = logging.getLogger(__name__)

MARKER_FOLDER = "mlxd-warmed"
# Bump when the warm-up's kernels change for the same key (a new kind of run).
KEY_VERSION = 1
# Where std::filesystem::temp_directory_path (MLX's choice) looks, in order.
_TMP_VARS = ("TMPDIR", "TMP", "TEMP", "TEMPDIR")


def compiled_kernels_dir(device: str, env: Mapping[str, str], version: str | None = None) -> Path | None:
    """The folder MLX keeps ``device``'s compiled kernels in, or None (Metal)."""
    version = version or installed_mlx_version()
    tmp = Path(next((env[v] for v in _TMP_VARS if env.get(v)), "/tmp"))
    if device == "cuda":
        return Path(env[PTX_ENV]) if env.get(PTX_ENV) else tmp / "mlx" / version / "ptx"
    if device == "cpu":
        return tmp / "mlx" / version / "cpu"
    return None


def warmup_key(*, config: Mapping[str, Any], dtypes: Sequence[str], kv_bits: int | None, batching: bool,
               runs: Sequence[Any], device: str) -> str:
    """A name for what decides the warm-up's kernels (pure)."""
    facts = {
        "version": KEY_VERSION, "config": config, "dtypes": sorted(set(dtypes)), "kv_bits": kv_bits,
        "batching": batching, "runs": [asdict(r) for r in runs], "device": device,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def weight_dtypes(model: Any) -> list[str]:
    """Worker thread: the dtypes of the model's weights (a float32 import and
    its bf16 original compile different kernels from the same config)."""
    from mlx.utils import tree_flatten

    return sorted({str(a.dtype) for _, a in tree_flatten(model.parameters())})


def model_marker(model: Any, folder: Path, device: str, device_name: str, *, kv_bits: int | None,
                 batching: bool, runs: Sequence[Any], extra: Mapping[str, Any] | None = None) -> "WarmupMarker | None":
    """Worker thread: the marker of a model's warm-up in this device's kernel
    folder, or None where kernels are not compiled to disk (Metal). Its key
    holds the model's ``config.json`` ({} when it cannot be read: the key
    still holds the dtypes and the plan) and ``extra``, what else the
    warm-up compiles (Whisper's fallback temperatures)."""
    kernels = compiled_kernels_dir(device, os.environ)
    if kernels is None:
        return None
    config = {**(extra or {}), **read_json_object(folder / "config.json")}
    key = warmup_key(config=config, dtypes=weight_dtypes(model), kv_bits=kv_bits, batching=batching,
                     runs=runs, device=f"{device}:{device_name}")
    return WarmupMarker(kernels, key)


class WarmupMarker:
    """The marker of one key in one kernel folder. Plain file I/O."""

    def __init__(self, kernels: Path, key: str) -> None:
        self.path = kernels / MARKER_FOLDER / key

    def known(self) -> bool:
        try:
            return self.path.is_file()
        except OSError:
            return False

    def write(self, model: str, report: Mapping[str, Any]) -> None:
        """After a completed warm-up. A failure is logged: the next load
        warms in the background again, which is only slower."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            partial.write_text(json.dumps({"model": model, **report}), encoding="utf-8")
            partial.replace(self.path)
        except OSError as exc:
            log.warning("could not note the warm-up of %s in %s: %s", model, self.path.parent, exc)
