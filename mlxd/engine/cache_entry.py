"""A prefix-cache entry as bytes, and the check that one fits the loaded model.

The bytes are mlx-lm's ``save_prompt_cache`` safetensors layout (every
layer's ``state`` and its class name) plus mlxd's metadata: the cache format
version, the fingerprint, the token count, the token ids and the entry's
kind (a generation's end or a checkpoint). Any layer type
``load_prompt_cache`` can rebuild persists (``cache_layers.PERSISTABLE_LAYERS``).
Worker thread (MLX).
"""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxd.engine import cache_layers
from mlxd.engine.fingerprint import CACHE_FORMAT_VERSION

KINDS = ("reply", "prompt", "system")


class EntryError(ValueError):
    """A saved entry that must not be used (wrong model, length or layout)."""


def encode_entry(tokens: Sequence[int], cache: list[Any], fingerprint: str, kind: str = "reply") -> bytes:
    """Safetensors bytes of one entry (``save_prompt_cache`` layout)."""
    from mlx_lm.models.cache import save_prompt_cache

    if not cache_layers.persistable(cache):
        raise EntryError("a cache layer type mlx-lm cannot load")
    held = cache_layers.positions(cache)
    if held not in (None, len(tokens)):
        raise EntryError(f"KV length {held} differs from {len(tokens)} tokens")
    metadata = {
        "mlxd_format": str(CACHE_FORMAT_VERSION),
        "fingerprint": fingerprint,
        "token_count": str(len(tokens)),
        "tokens": encode_tokens(tokens),
        "kind": kind,
    }
    buffer = io.BytesIO()
    save_prompt_cache(buffer, cache, metadata)
    return buffer.getvalue()


@dataclass(frozen=True)
class DecodedEntry:
    tokens: list[int]
    cache: list[Any]
    kind: str


def decode_entry(
    payload: bytes, fingerprint: str, expected_tokens: int, layout: CacheLayout | None = None
) -> DecodedEntry:
    """The entry in ``encode_entry``'s bytes, fully evaluated.

    Raises ``EntryError`` unless the entry belongs to ``fingerprint``, its
    token count, stored tokens and every position-counting layer all say
    ``expected_tokens`` (what the manifest recorded), and, given the loaded
    model's ``layout``, its layers match it (count, types, shapes, dtypes,
    window sizes).
    """
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache

    buffer = io.BytesIO(payload)
    buffer.name = "entry.safetensors"  # mx.load picks the format from the name
    try:
        cache, metadata = load_prompt_cache(buffer, return_metadata=True)
        # Arrays are read lazily: evaluate while the buffer is alive.
        mx.eval(cache_layers.arrays_of(cache))
    except Exception as exc:
        raise EntryError(f"unreadable entry ({type(exc).__name__})") from exc
    if metadata.get("mlxd_format") != str(CACHE_FORMAT_VERSION):
        raise EntryError(f"format {metadata.get('mlxd_format')!r}, expected {CACHE_FORMAT_VERSION}")
    if metadata.get("fingerprint") != fingerprint:
        raise EntryError("the entry was saved by a different model")
    if not cache_layers.persistable(cache):
        raise EntryError("unexpected cache layer types")
    tokens = decode_tokens(metadata.get("tokens", ""))
    counts = {len(tokens), _int(metadata.get("token_count"))}
    held = cache_layers.positions(cache)
    if held is not None:
        counts.add(held)
    if counts != {expected_tokens} or not cache_layers.array_lengths_agree(cache, expected_tokens):
        raise EntryError(f"token count / KV length mismatch: {sorted(map(str, counts))}")
    kind = metadata.get("kind", "reply")
    if kind not in KINDS:
        raise EntryError(f"unknown entry kind {kind!r}")
    if layout is not None:
        layout.check(cache)
    return DecodedEntry(tokens, cache, kind)


@dataclass(frozen=True)
class CacheLayout:
    """What every cache of one loaded model looks like, but for its length:
    per layer the cache type and each array's shape (batch and position axes
    left out), dtype and window size. The fingerprint says which files wrote
    an entry; this says the entry fits the model that is loaded now. A
    checksum can be recomputed by whoever rewrites a file, and an entry with
    fewer layers would silently run the model on only those (mlx-lm zips
    layers with the cache), so it is checked before any entry is used."""

    layers: tuple[cache_layers.Layout, ...]

    @classmethod
    def of(cls, cache: Sequence[Any]) -> CacheLayout:
        return cls(tuple(cache_layers.layer_layout(layer) for layer in cache))

    def check(self, cache: Sequence[Any]) -> None:
        """Raises ``EntryError`` naming the first difference."""
        if len(cache) != len(self.layers):
            raise EntryError(f"does not fit the model: {len(cache)} layers, the model has {len(self.layers)}")
        for i, (layer, expected) in enumerate(zip(cache, self.layers)):
            got = cache_layers.layer_layout(layer)
            if got != expected:
                raise EntryError(f"does not fit the model: layer {i} is {cache_layers.describe(got)}, "
                                 f"the model's is {cache_layers.describe(expected)}")


def model_cache_layout(model: Any, kv_bits: int | None, group_size: int = 64) -> CacheLayout:
    """The layout of ``model``'s cache, read off a one-token forward pass
    (as a generation would build it, quantised with ``kv_bits``). Worker thread."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    maybe_quantize_kv_cache(cache, 0, group_size, kv_bits)
    mx.eval(cache_layers.arrays_of(cache))
    return CacheLayout.of(cache)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def encode_tokens(tokens: Sequence[int]) -> str:
    return base64.b64encode(struct.pack(f"<{len(tokens)}i", *tokens)).decode("ascii")


def decode_tokens(text: str) -> list[int]:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise EntryError("the stored tokens are not valid") from exc
    if len(raw) % 4:
        raise EntryError("the stored tokens are not valid")
    return list(struct.unpack(f"<{len(raw) // 4}i", raw))
