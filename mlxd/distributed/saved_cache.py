"""A gang's kept KV caches on disk, between one load of the gang and the next.

Under ``<cache_dir>/gang-prefix/<fingerprint>-<mode>-<ranks>/``: each local
rank writes its own shard of every entry to ``rank<N>/<id>.safetensors``
(mlx-lm's prompt-cache files), and the daemon, once every rank has said
which it wrote, ``manifest.json``: the entries all of them hold, with their
token ids. The folder is named by the weights' fingerprint and the split,
so a changed model or another split never reads another's shards.

A rank on another host has no folder here (its files would be on its own
disk, out of this daemon's reach), so a gang with one keeps its entries in
memory only. The folder holds at most what the gang held in memory
(``prefix_cache.max_bytes``); each save replaces the last one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from mlxd.engine.fingerprint import model_fingerprint
from mlxd.errors import describe_exception
from mlxd.registry.model import ModelSpec
from mlxd.registry.parallel import LOCAL

log = logging.getLogger("mlxd.distributed")

MANIFEST = "manifest.json"


async def gang_folder(spec: ModelSpec, cache_dir: Path | None) -> Path | None:
    """Where ``spec``'s gang saves its entries (None: it does not)."""
    parallel = spec.parallel
    if cache_dir is None or parallel is None or not spec.prefix_cache.saves:
        return None
    if any(host != LOCAL for host in parallel.hosts):
        return None
    try:
        fingerprint = await asyncio.to_thread(model_fingerprint, spec.path, spec.kv_bits)
    except OSError as exc:
        log.warning("prefix cache of %s not persisted: %s", spec.name, describe_exception(exc))
        return None
    return Path(cache_dir) / "gang-prefix" / f"{fingerprint}-{parallel.mode}-{len(parallel.hosts)}"


def read_manifest(folder: Path) -> list[dict[str, Any]]:
    """The saved entries (``id``, ``tokens``, ``nbytes``); none when there
    is no manifest or it cannot be read (logged)."""
    path = folder / MANIFEST
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text())["entries"]
        return [{"id": int(e["id"]), "tokens": [int(t) for t in e["tokens"]], "nbytes": int(e["nbytes"])}
                for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("saved prefix cache %s not read: %s", path, describe_exception(exc))
        return []


def write_manifest(folder: Path, entries: list[tuple[int, tuple[int, ...], int]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / (MANIFEST + ".part")
    part.write_text(json.dumps({"entries": [{"id": i, "tokens": list(t), "nbytes": n} for i, t, n in entries]}))
    part.replace(folder / MANIFEST)


def forget(folder: Path) -> int:
    """The saved entries removed; how many the manifest listed."""
    count = len(read_manifest(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return count


async def clear_saved_gang_cache(spec: ModelSpec, cache_dir: Path) -> int:
    """An unloaded gang's saved entries, removed (its next load would
    restore them otherwise); how many there were."""
    folder = await gang_folder(spec, cache_dir)
    return 0 if folder is None else await asyncio.to_thread(forget, folder)
