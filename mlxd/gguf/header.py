"""A bounds-checked walk over a GGUF file's header, before MLX reads it.

MLX's GGUF reader trusts the counts and lengths in the header: a corrupt file
can crash the process (a segmentation fault, not an exception), and a daemon
reading a registry must not die of a bad file. This walk checks every length
against the file size and returns each tensor's GGUF type, without decoding
the metadata values (that is MLX's job, and fast).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from mlxd.errors import GGUFError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_name: str


class _Corrupt(Exception):
    pass


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise _Corrupt(f"a length at byte {self.at} runs past the end of the file")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        raw = self.take(self.u64())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"a string before byte {self.at} is not UTF-8") from None

    def skip_value(self, kind: int) -> None:
        if kind in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[kind])
        elif kind == _STRING:
            self.take(self.u64())
        elif kind == _ARRAY:
            inner, count = self.u32(), self.u64()
            if inner in _SCALAR_SIZES:
                self.take(_SCALAR_SIZES[inner] * count)
            else:
                for _ in range(count):
                    self.skip_value(inner)
        else:
            raise _Corrupt(f"unknown metadata value type {kind} at byte {self.at}")


def scan_header(path: Path) -> list[TensorInfo]:
    """The tensors ``path`` declares; :class:`GGUFError` if any part of the
    header or tensor data lies outside the file."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _scan(path, _Cursor(data), len(data))
    except ValueError:  # mmap of an empty file
        raise GGUFError(f"{path} is empty") from None
    except _Corrupt as exc:
        raise GGUFError(f"{path} is corrupt or truncated ({exc})") from None


def _scan(path: Path, cursor: _Cursor, size: int) -> list[TensorInfo]:
    if cursor.take(4) != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    version = cursor.u32()
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = cursor.u64(), cursor.u64()
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(kv_count):
        key, kind = cursor.string(), cursor.u32()
        if key == "general.alignment" and kind == 4:
            alignment = cursor.u32() or _DEFAULT_ALIGNMENT
        else:
            cursor.skip_value(kind)
    infos, extents = [], []
    for _ in range(tensor_count):
        name, ndims = cursor.string(), cursor.u32()
        if ndims > 8:
            raise _Corrupt(f"tensor {name} claims {ndims} dimensions")
        dims = [cursor.u64() for _ in range(ndims)]
        type_id, offset = cursor.u32(), cursor.u64()
        try:
            kind = GGMLQuantizationType(type_id)
        except ValueError:
            raise _Corrupt(f"tensor {name} has unknown type {type_id}") from None
        block, block_bytes = GGML_QUANT_SIZES[kind]
        count = 1
        for d in dims:
            count *= d
        infos.append(TensorInfo(name, tuple(reversed(dims)), kind.name))
        extents.append((name, offset, count // block * block_bytes))
    data_start = -(-cursor.at // alignment) * alignment
    for name, offset, length in extents:
        if data_start + offset + length > size:
            raise _Corrupt(f"the data of tensor {name} runs past the end of the file")
    return infos
