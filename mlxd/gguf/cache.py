"""GGUF files named in a registry, converted once into mlxd's cache.

The converted folder is keyed by the file's content (sha256), so a replaced
file converts again and a copied one does not. Hashing a large file takes a
while: the key is remembered per (path, size, mtime) so that re-reading the
registry (reload, ``mlxd check``) does not hash it again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mlxd.files import file_sha256
from mlxd.gguf.convert import KEEP, import_dtype, import_gguf

# Bump when the converted folder for the same file changes.
CONVERTER_VERSION = 1


def content_key(source: Path, cache_root: Path) -> str:
    stat = source.stat()
    memo_dir = cache_root / "gguf" / "keys"
    stamp = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTER_VERSION}"
    memo = memo_dir / hashlib.sha256(stamp.encode()).hexdigest()[:32]
    try:
        return json.loads(memo.read_text())["key"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    key = file_sha256(source, prefix=f"mlxd-gguf/{CONVERTER_VERSION}\n".encode()).hexdigest()[:32]
    memo_dir.mkdir(parents=True, exist_ok=True)
    memo.write_text(json.dumps({"key": key, "source": str(source.resolve())}))
    return key


def converted_dir(source: Path, cache_root: Path, dtype: str = KEEP) -> Path:
    """The mlx-lm folder converted from ``source`` (in ``dtype``, see
    :func:`mlxd.gguf.convert.import_gguf`), converting it if needed."""
    source, cache_root, dtype = Path(source), Path(cache_root).expanduser(), import_dtype(dtype)
    # A kept conversion has no dtype in its name: folders from before there
    # was a choice are still found.
    label = "" if dtype == KEEP else f"-{dtype}"
    target = cache_root / "gguf" / f"{source.name.removesuffix('.gguf')}{label}-{content_key(source, cache_root)}"
    if (target / "config.json").is_file():
        return target
    return import_gguf(source, target, dtype=dtype)
