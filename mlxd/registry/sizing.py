"""How many bytes a model costs: memory strings, exact weights, KV cache size.

Everything here is arithmetic on files and numbers; nothing loads a model.
Sizes use binary units throughout: ``1 GB == 1 GiB == 1024**3`` bytes, the way
macOS labels RAM and vllm-mlx reads ``memory_budget_gb``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_UNITS = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kb": KIB,
    "kib": KIB,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
    "t": TIB,
    "tb": TIB,
    "tib": TIB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*%\s*$")

# mlx-lm's QuantizedKVCache default: one scale and one bias per 64 elements.
KV_GROUP_SIZE = 64
# Bit widths mlx-lm's quantized KV cache packs correctly into uint32 words.
KV_BITS_CHOICES = (2, 4, 8)

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
# Safetensors dtype codes and their element sizes, for validating headers.
_SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "U16": 16,
    "I16": 16,
    "F16": 16,
    "BF16": 16,
    "U32": 32,
    "I32": 32,
    "F32": 32,
    "U64": 64,
    "I64": 64,
    "F64": 64,
    "C64": 64,
}
# A safetensors header is JSON text; anything larger than this is a corrupt file.
_MAX_HEADER_BYTES = 100 * MIB

# Keys different architectures use for the same dimension, most common first.
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim")


def parse_bytes(value: Any) -> int:
    """A size as bytes: an int, or a string like ``"256MB"``, ``"1.5GiB"``, ``"512 kb"``.

    Units are binary and case-insensitive (B, K/KB/KiB, M/MB/MiB, G/GB/GiB,
    T/TB/TiB); a bare number is bytes. Percentages are not sizes here: see
    :func:`parse_memory_budget`.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 512MB or 2GB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative ({value})")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"a size in bytes must be a whole, non-negative number, got {value!r}")
        return int(value)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            if _PERCENT_RE.match(value):
                raise ValueError(
                    f"a percentage ({value}) is only allowed for manager.memory_budget"
                )
            raise ValueError(
                f"cannot read {value!r} as a size; write a number of bytes or a string "
                "such as 512MB, 1.5GiB or 48GB"
            )
        number, unit = match.groups()
        return int(float(number) * _UNITS[unit.lower()])
    raise ValueError(f"expected a size such as 512MB or 2GB, got {_kind_of(value)}")


def _kind_of(value: Any) -> str:
    """A value of the wrong type, as a message names it."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value)


def parse_memory_budget(value: Any, physical_memory: int) -> int:
    """``manager.memory_budget``: a size (see :func:`parse_bytes`) or ``"70%"`` of RAM."""
    if isinstance(value, str):
        match = _PERCENT_RE.match(value)
        if match is not None:
            percent = float(match.group(1))
            if not 0 < percent <= 100:
                raise ValueError(
                    f"a memory percentage must be above 0% and at most 100%, got {value}"
                )
            return int(physical_memory * percent / 100)
    budget = parse_bytes(value)
    # A bare small integer is almost always a number of GB written the way
    # vllm-mlx's legacy ``memory_budget`` key reads it; say so instead of
    # rejecting every model as over budget.
    if isinstance(value, int) and budget < MIB:
        raise ValueError(
            f"{value} is read as {value} bytes; write '{value}GB' or use memory_budget_gb: {value}"
        )
    if budget == 0:
        raise ValueError("the memory budget must be larger than 0")
    return budget


def parse_gb(value: Any) -> int:
    """vllm-mlx's ``memory_budget_gb``: a number of GB, or a string ending gb/mb/b."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number of GB, got {_kind_of(value)}")
    multiplier = GIB
    amount: Any = value
    if isinstance(value, str):
        raw = value.strip().lower()
        for suffix, unit in (("gb", GIB), ("mb", MIB), ("b", 1)):
            if raw.endswith(suffix):
                raw, multiplier = raw[: -len(suffix)].strip(), unit
                break
        try:
            amount = float(raw)
        except ValueError:
            raise ValueError(f"cannot read {value!r} as a number of GB") from None
    amount = float(amount)
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"must be a positive number, got {value!r}")
    result = int(amount * multiplier)
    if result == 0:
        raise ValueError(f"{value!r} is less than one byte")
    return result


def format_bytes(n: int | float) -> str:
    """A short human size in binary units: ``3.1 GB``, ``256.0 MB``, ``512 B``."""
    for unit, size in (("TB", TIB), ("GB", GIB), ("MB", MIB), ("KB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files the loaders read, sorted.

    mlx-lm reads ``model*.safetensors``; some Hugging Face repositories also ship
    a ``consolidated.safetensors`` copy of the same weights, which must not be
    counted twice. Folders without ``model*`` files (some mlx-vlm conversions)
    are counted by every ``*.safetensors``.
    """
    files = sorted(model_dir.glob("model*.safetensors"))
    return files or sorted(model_dir.glob("*.safetensors"))


def safetensors_bytes(path: Path) -> int:
    """The bytes of tensor data in one safetensors file, read from its header only."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise ConfigError(f"{path} is not a safetensors file (shorter than 8 bytes)")
            (header_len,) = struct.unpack("<Q", prefix)
            file_size = path.stat().st_size
            if header_len > min(_MAX_HEADER_BYTES, file_size - 8):
                raise ConfigError(f"{path} is not a valid safetensors file (bad header length)")
            header = json.loads(handle.read(header_len))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError(f"{path} is not a valid safetensors file (header is not JSON)") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path} is not a valid safetensors file (header is not a mapping)")
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = info["data_offsets"]
            start, end = int(start), int(end)
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: tensor {name!r} has no valid data_offsets") from None
        if not 0 <= start <= end:
            raise ConfigError(f"{path}: tensor {name!r} has invalid data_offsets")
        total += end - start
    if total > file_size - 8 - header_len:
        raise ConfigError(f"{path} is truncated: its header lists more data than the file holds")
    return total


def weights_bytes(model_dir: Path) -> int:
    """Exact bytes of a model's weights, summed from safetensors headers."""
    files = weight_files(model_dir)
    if not files:
        raise ConfigError(f"no *.safetensors weights in {model_dir}")
    return sum(safetensors_bytes(f) for f in files)


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's settings; vision models nest them in ``text_config``."""
    merged = dict(config)
    nested = config.get("text_config")
    if isinstance(nested, Mapping):
        merged.update(nested)
    return merged


def _first_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def dtype_bytes(config: Mapping[str, Any]) -> int:
    """Bytes per KV element: the activation dtype, float16 when unstated."""
    cfg = text_config(config)
    name = cfg.get("torch_dtype") or cfg.get("dtype") or "float16"
    return _DTYPE_BYTES.get(str(name).removeprefix("torch."), 2)


def encoder_activation_bytes(config_json: Mapping[str, Any], batch_tokens: int) -> int:
    """What one forward pass of an embedding or rerank model holds beside its
    weights: for ``batch_tokens`` padded tokens, the float32 hidden states
    of a layer (a few hidden-wide tensors and the intermediate one) and its
    attention scores (a row's heads x its width, up to 512 positions)."""
    cfg = text_config(config_json)
    hidden = _first_int(cfg, _HIDDEN_KEYS) or 0
    intermediate = _first_int(cfg, ("intermediate_size",)) or 4 * hidden
    heads = _first_int(cfg, _HEAD_KEYS) or 1
    width = min(_first_int(cfg, ("max_position_embeddings",)) or 512, 512)
    return batch_tokens * 4 * (4 * hidden + intermediate + heads * width)


def kv_cache_bytes(
    config_json: Mapping[str, Any],
    max_context: int,
    max_concurrency: int,
    kv_bits: int | None = None,
) -> int:
    """The KV cache of ``max_concurrency`` sequences of ``max_context`` tokens.

    Without quantisation::

        2 (K and V) x layers x kv_heads x head_dim x max_context x max_concurrency x dtype_bytes

    With ``kv_bits`` (mlx-lm's QuantizedKVCache, groups of 64): each head
    vector of ``head_dim`` elements is packed into ``head_dim x kv_bits / 8``
    bytes, plus a scale and a bias in the activation dtype per group, so an
    element costs ``kv_bits / 8 + 2 x dtype_bytes / 64`` bytes (0.5625 for
    4-bit with float16 scales).
    """
    cfg = text_config(config_json)
    layers = _first_int(cfg, _LAYER_KEYS)
    heads = _first_int(cfg, _HEAD_KEYS)
    if layers is None or heads is None:
        missing = "num_hidden_layers" if layers is None else "num_attention_heads"
        raise ConfigError(
            f"config.json has no `{missing}`, so the KV cache cannot be sized; "
            "set estimated_memory_gb for this model"
        )
    kv_heads = _first_int(cfg, _KV_HEAD_KEYS) or heads
    head_dim = _first_int(cfg, ("head_dim",))
    if head_dim is None:
        hidden = _first_int(cfg, _HIDDEN_KEYS)
        if hidden is None:
            raise ConfigError(
                "config.json has neither `head_dim` nor `hidden_size`, so the KV cache "
                "cannot be sized; set estimated_memory_gb for this model"
            )
        head_dim = hidden // heads
    element_bytes = dtype_bytes(config_json)
    vectors = 2 * layers * kv_heads * max_context * max_concurrency
    if kv_bits is None:
        return vectors * head_dim * element_bytes
    if kv_bits not in KV_BITS_CHOICES:
        raise ConfigError(f"kv_bits must be one of {', '.join(map(str, KV_BITS_CHOICES))}")
    packed = math.ceil(head_dim * kv_bits / 8)
    groups = math.ceil(head_dim / KV_GROUP_SIZE)
    return vectors * (packed + 2 * groups * element_bytes)


def max_position_embeddings(config_json: Mapping[str, Any]) -> int | None:
    return _first_int(text_config(config_json), ("max_position_embeddings", "n_positions"))
