"""A model folder's fingerprint: which saved prefix caches it may read.

A saved KV cache is only valid for the exact weights, tokenizer and KV format
that computed it. The fingerprint hashes everything that changes the KV values
or the token ids they are keyed by, so a re-quantised, fine-tuned or replaced
model lands in a different folder and never reads an old cache:

- every weights file's name, size, safetensors header (names, dtypes, shapes,
  offsets) and a sample of its data: fixed-size blocks spread over the file,
  and a block from the middle of every tensor. Two checkpoints with the same
  shapes differ there; blocks spread over the file alone missed a fine-tune
  that changed a few tensors (a LoRA fused into its attention layers, written
  over the old files), whose old KV would then have been restored. Reading
  a few MB is cheap even for a 40 GB model;
- ``config.json``, the tokenizer files, the chat template files and any
  custom modelling code (``*.py``), byte for byte;
- the KV quantisation (``kv_bits``) and the cache format version.

The folder's path is not part of it: the same files elsewhere share caches.
Plain file I/O, no MLX: run it off the event loop (``asyncio.to_thread``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import struct
from pathlib import Path

from mlxd.files import file_sha256

# Bump when the bytes of a saved entry change meaning; old folders are then
# never read (and age out under the disk bound).
CACHE_FORMAT_VERSION = 1

# Files hashed in full: what decides token ids and KV values besides the weights.
HASHED_PATTERNS = (
    "config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "chat_template*",
    "*.tiktoken",
    "*.safetensors.index.json",
    "*.py",
)

_SAMPLE_BLOCKS = 16
_SAMPLE_BLOCK_BYTES = 16 << 10
_TENSOR_BLOCK_BYTES = 4 << 10
_MAX_HEADER_BYTES = 100 << 20


def model_fingerprint(folder: Path, kv_bits: int | None) -> str:
    """A hex digest naming the cache folder of the model in ``folder``.

    Raises ``OSError`` when the folder cannot be read (the caller then runs
    without persistence rather than fail the load).
    """
    digest = hashlib.sha256()
    digest.update(f"mlxd-prefix-cache/{CACHE_FORMAT_VERSION}/kv_bits={kv_bits}\n".encode())
    files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    weights = [p for p in files if p.name.endswith(".safetensors")]
    if not weights:
        raise OSError(f"no .safetensors weights in {folder}")
    for path in weights:
        digest.update(f"weights {path.name} {path.stat().st_size}\n".encode())
        digest.update(_weights_digest(path))
    for path in files:
        if any(fnmatch.fnmatch(path.name, pattern) for pattern in HASHED_PATTERNS):
            digest.update(f"file {path.name} {path.stat().st_size}\n".encode())
            digest.update(file_sha256(path).digest())
    return digest.hexdigest()[:32]


def _weights_digest(path: Path) -> bytes:
    """The safetensors header plus evenly spread blocks of the data."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        digest.update(prefix)
        header = b""
        if len(prefix) == 8:
            (header_len,) = struct.unpack("<Q", prefix)
            header = handle.read(min(header_len, _MAX_HEADER_BYTES))
            digest.update(header)
        for offset in _sample_offsets(size):
            handle.seek(offset)
            digest.update(handle.read(_SAMPLE_BLOCK_BYTES))
        for offset in _tensor_offsets(header, 8 + len(header)):
            handle.seek(offset)
            digest.update(handle.read(_TENSOR_BLOCK_BYTES))
    return digest.digest()


def _tensor_offsets(header: bytes, data_start: int) -> list[int]:
    """Where a block from the middle of each tensor starts, in file order (one
    pass forward over the disk); none for a header that is not safetensors'
    JSON (it is hashed as it is)."""
    try:
        tensors = json.loads(header)
    except ValueError:
        return []
    offsets = []
    for name, info in tensors.items() if isinstance(tensors, dict) else ():
        span = info.get("data_offsets") if isinstance(info, dict) and name != "__metadata__" else None
        if isinstance(span, list) and len(span) == 2 and all(isinstance(o, int) for o in span) and span[1] > span[0]:
            start, end = span
            offsets.append(data_start + max(start, (start + end - _TENSOR_BLOCK_BYTES) // 2))
    return sorted(offsets)


def _sample_offsets(size: int) -> list[int]:
    if size <= _SAMPLE_BLOCKS * _SAMPLE_BLOCK_BYTES:
        return list(range(0, size, _SAMPLE_BLOCK_BYTES))
    last = size - _SAMPLE_BLOCK_BYTES
    return [last * i // (_SAMPLE_BLOCKS - 1) for i in range(_SAMPLE_BLOCKS)]


