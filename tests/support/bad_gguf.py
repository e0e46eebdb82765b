"""The audit's hostile GGUF files, a few hundred bytes to 15 KB each, written
byte by byte (llama.cpp's own writer refuses to write most of them).

Each is a header a careless or hostile download could carry: metadata
arrays nested 1,200 deep (Python's recursion limit, once a crash of
``mlxd serve``), counts no file can hold, tensor offsets outside the data,
misaligned or overlapping, a zero-size dimension, and well-formed files whose
tokenizer lists make the converter itself fail (a merge naming tokens the
vocabulary lacks panics the Rust tokenizer; no token list at all).

Run as a script to write them all into a folder:
``python tests/support/bad_gguf.py DIR``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from pathlib import Path

_U32, _F32, _STRING, _ARRAY = 4, 6, 8, 9
_ALIGN = 32


def _str(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _str(key) + struct.pack("<II", _U32, value)


def _kv_str(key: str, value: str) -> bytes:
    return _str(key) + struct.pack("<I", _STRING) + _str(value)


def _kv_strings(key: str, values: list[str]) -> bytes:
    return _str(key) + struct.pack("<IIQ", _ARRAY, _STRING, len(values)) + b"".join(_str(v) for v in values)


def _file(kvs: list[bytes], tensors: list[tuple[str, list[int], int]], *,
          tensor_count: int | None = None, kv_count: int | None = None, data: bytes | None = None) -> bytes:
    """A GGUF v3 file of F32 tensors: (name, dims as GGUF lists them, offset)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if tensor_count is None else tensor_count,
                                 len(kvs) if kv_count is None else kv_count)
    head += b"".join(kvs)
    for name, dims, offset in tensors:
        head += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", 0, offset)  # type 0: F32
    head += b"\0" * (-len(head) % _ALIGN)
    return head + (b"\0" * 256 if data is None else data)


def _model_kvs(tokens: list[str] | None = None, merges: list[str] | None = None) -> list[bytes]:
    """Metadata a tiny llama needs, so that only the named defect is wrong."""
    kvs = [
        _kv_str("general.architecture", "llama"),
        _kv_u32("llama.embedding_length", 8), _kv_u32("llama.block_count", 1),
        _kv_u32("llama.feed_forward_length", 8), _kv_u32("llama.context_length", 64),
        _kv_u32("llama.attention.head_count", 2), _kv_str("tokenizer.ggml.model", "gpt2"),
        _kv_u32("tokenizer.ggml.eos_token_id", 1),
    ]
    if tokens is not None:
        kvs.append(_kv_strings("tokenizer.ggml.tokens", tokens))
    if merges is not None:
        kvs.append(_kv_strings("tokenizer.ggml.merges", merges))
    return kvs


def nested_arrays() -> bytes:
    """The audit's repro: one key whose value is an array of an array of ...
    1,200 deep (14 KB)."""
    value = struct.pack("<I", _ARRAY) + struct.pack("<IQ", _ARRAY, 1) * 1200 + struct.pack("<IQ", _U32, 0)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("deep.key") + value


def huge_array_count() -> bytes:
    """An array of 2**62 strings in a file of a few hundred bytes."""
    value = struct.pack("<IIQ", _ARRAY, _STRING, 1 << 62) + _str("a")
    return _file([_str("general.things") + value], [("token_embd.weight", [8, 2], 0)])


def huge_key_count() -> bytes:
    return _file(_model_kvs(), [("token_embd.weight", [8, 2], 0)], kv_count=1 << 60)


def huge_tensor_count() -> bytes:
    return _file(_model_kvs(), [("token_embd.weight", [8, 2], 0)], tensor_count=1 << 60)


def offset_past_the_end() -> bytes:
    return _file(_model_kvs(["a", "b"]), [("token_embd.weight", [8, 2], (1 << 64) - 32)])


def misaligned_offset() -> bytes:
    return _file(_model_kvs(["a", "b"]), [("token_embd.weight", [8, 2], 4)])


def overlapping_tensors() -> bytes:
    return _file(_model_kvs(["a", "b"]), [("token_embd.weight", [8, 2], 0), ("output_norm.weight", [8], 32)])


def zero_dimension() -> bytes:
    return _file(_model_kvs(["a", "b"]), [("token_embd.weight", [8, 0], 0)])


def merge_of_unknown_tokens() -> bytes:
    """A well-formed file whose merge ``a b`` names a token ``ab`` the
    vocabulary lacks: the Rust tokenizer panics (a BaseException) on it."""
    return _file(_model_kvs(["a", "b"], ["a b"]), [("token_embd.weight", [8, 2], 0)], data=b"\0" * 64)


def no_token_list() -> bytes:
    return _file(_model_kvs(), [("token_embd.weight", [8, 2], 0)], data=b"\0" * 64)


# name -> (the bytes, what the error says)
BAD_FILES: dict[str, tuple[Callable[[], bytes], str]] = {
    "nested-arrays": (nested_arrays, "nest deeper than 8 levels"),
    "huge-array-count": (huge_array_count, "more than the file holds"),
    "huge-key-count": (huge_key_count, "more than the file holds"),
    "huge-tensor-count": (huge_tensor_count, "more than the file holds"),
    "offset-past-the-end": (offset_past_the_end, "runs past the end of the file"),
    "misaligned-offset": (misaligned_offset, "is not aligned to 32 bytes"),
    "overlapping-tensors": (overlapping_tensors, "overlaps another tensor's"),
    "zero-dimension": (zero_dimension, "has a dimension of size 0"),
    "merge-of-unknown-tokens": (merge_of_unknown_tokens, "merge `a b` names a token the vocabulary lacks"),
    "no-token-list": (no_token_list, "has no tokenizer.ggml.tokens"),
}


def write_bad_gguf(name: str, folder: Path) -> Path:
    path = Path(folder) / f"{name}.gguf"
    path.write_bytes(BAD_FILES[name][0]())
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for each in BAD_FILES:
        print(write_bad_gguf(each, out))
