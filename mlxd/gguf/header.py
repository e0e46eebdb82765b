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
# No writer nests metadata arrays (MLX reads one level); a few levels leave
# room for odd files, and a cap keeps a walk of a hostile one short.
MAX_ARRAY_DEPTH = 8
# The fewest bytes a string (its length) or an array (type and count) takes,
# so a count the rest of the file cannot hold is refused before any walk.
_MIN_VALUE_BYTES = {_STRING: 8, _ARRAY: 12}
# A key-value pair: key length, value type, a one-byte value. A tensor entry:
# name length, dimension count, type, offset.
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8


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

    def left(self) -> int:
        return len(self.data) - self.at

    def skip_value(self, kind: int) -> None:
        """Step over one metadata value. Arrays of arrays are walked with a
        stack, not recursion: a file nests as deep as its bytes allow, and
        Python's recursion limit is no bound a hostile file must respect."""
        pending: list[tuple[int, int]] = []  # (element type, elements left) per open array
        while True:
            if kind in _SCALAR_SIZES:
                self.take(_SCALAR_SIZES[kind])
            elif kind == _STRING:
                self.take(self.u64())
            elif kind == _ARRAY:
                inner, count = self.u32(), self.u64()
                if inner in _SCALAR_SIZES:
                    self.take(_SCALAR_SIZES[inner] * count)
                else:
                    if len(pending) >= MAX_ARRAY_DEPTH:
                        raise _Corrupt(f"metadata arrays nest deeper than {MAX_ARRAY_DEPTH} levels at byte {self.at}")
                    if count * _MIN_VALUE_BYTES.get(inner, 1) > self.left():
                        raise _Corrupt(f"an array at byte {self.at} claims {count} elements, more than the file holds")
                    pending.append((inner, count))
            else:
                raise _Corrupt(f"unknown metadata value type {kind} at byte {self.at}")
            while pending and pending[-1][1] == 0:
                pending.pop()
            if not pending:
                return
            kind, count = pending[-1]
            pending[-1] = (kind, count - 1)


def scan_header(path: Path) -> list[TensorInfo]:
    """The tensors ``path`` declares; :class:`GGUFError` if any part of the
    header or tensor data lies outside the file."""
    with open(path, "rb") as handle:
        try:
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # mmap of an empty file
            raise GGUFError(f"{path} is empty") from None
        with data:
            try:
                return _scan(path, _Cursor(data), len(data))
            except GGUFError:
                raise
            except _Corrupt as exc:
                raise GGUFError(f"{path} is corrupt or truncated ({exc})") from None
            except Exception as exc:  # whatever else a hostile header provokes is still a bad file
                raise GGUFError(f"{path} is corrupt or truncated ({type(exc).__name__}: {exc})") from None


def _scan(path: Path, cursor: _Cursor, size: int) -> list[TensorInfo]:
    if cursor.take(4) != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    version = cursor.u32()
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = cursor.u64(), cursor.u64()
    if kv_count * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_BYTES > cursor.left():
        raise _Corrupt(f"the header claims {kv_count} metadata keys and {tensor_count} tensors, "
                       "more than the file holds")
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
        if 0 in dims:
            # MLX reads an empty tensor, and the model then fails at load.
            raise _Corrupt(f"tensor {name} has a dimension of size 0 ({list(reversed(dims))})")
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
    end = 0
    for name, offset, length in sorted(extents, key=lambda e: e[1]):
        if data_start + offset + length > size:
            raise _Corrupt(f"the data of tensor {name} runs past the end of the file")
        if offset % alignment:
            raise _Corrupt(f"the data of tensor {name} is not aligned to {alignment} bytes (offset {offset})")
        if offset < end:
            raise _Corrupt(f"the data of tensor {name} overlaps another tensor's (offset {offset})")
        end = offset + length
    return infos
