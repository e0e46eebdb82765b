"""A text model's in-memory prefix cache, and its entries as bytes.

Agents and chat apps resend the same long system prompt on every turn. The
prefix cache keeps the KV state of finished prompts (prompt plus reply) keyed
by their token ids; a new request reuses the longest cached prefix and only
prefills the rest.

Built on mlx-lm's ``LRUPromptCache``: a token trie for the longest-prefix
lookup (it trims a longer entry down to the shared prefix), LRU order and a
byte bound. What this module adds:

- entries are *compacted* before they are kept: a ``KVCache`` allocates in
  steps of 256 positions and a trimmed one keeps its old buffer, so the
  stored arrays are cut to the KV length and copied; the byte bound then
  counts what is really held;
- the KV length of an entry always equals its number of tokens (checked on
  insert and on lookup): a mismatch would silently corrupt the output;
- a lookup leaves at least ``keep`` tokens to prefill: one, because the model
  must see a token to produce logits, or more when a repetition/presence
  penalty needs its look-back window (it only sees tokens it processed);
- ``encode_entry`` / ``decode_entry`` turn an entry into safetensors bytes
  and back (mlx-lm's ``save_prompt_cache`` layout plus our metadata: format
  version, fingerprint and the token ids).

Everything here touches MLX and runs on the worker thread. The counters are
plain ints the event loop may read at any time (``stats``).
"""

from __future__ import annotations

import base64
import io
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxd.engine.fingerprint import CACHE_FORMAT_VERSION

log = logging.getLogger(__name__)

# One LRUPromptCache per engine, so the trie's "model" key is a constant; and
# one cache type, so its LRU order is plain recency of insertion.
_MODEL_KEY = "model"
_CACHE_TYPE = "assistant"

# Layer caches whose KV length can be checked and that persist to disk.
PERSISTABLE_LAYERS = ("KVCache", "QuantizedKVCache")


class EntryError(ValueError):
    """A saved entry that must not be used (wrong model, length or layout)."""


@dataclass(frozen=True)
class Snapshot:
    """One cached prefix, as the save path sees it: read-only references."""

    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int


class PrefixCache:
    """A byte-bounded LRU of KV caches keyed by token prefix. Worker thread only."""

    def __init__(self, max_bytes: int, max_entries: int = 512) -> None:
        from mlx_lm.models.cache import LRUPromptCache

        self.max_bytes = max(0, int(max_bytes))
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=self.max_bytes)
        # Read by the event loop for /v1/status; written here only.
        self.entries = 0
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.tokens_reused = 0

    def fetch(self, tokens: Sequence[int], keep: int = 1) -> tuple[list[Any] | None, int]:
        """A private copy of the cache for the longest cached prefix of
        ``tokens`` and how many tokens it covers, leaving at least ``keep``
        tokens to prefill; ``(None, 0)`` on a miss."""
        from mlx_lm.models.cache import trim_prompt_cache

        tokens = list(tokens)
        limit = len(tokens) - max(1, keep)
        cache, rest = self._lru.fetch_nearest_cache(_MODEL_KEY, tokens)
        reused = len(tokens) - len(rest) if cache is not None else 0
        if cache is not None and reused > limit > 0 and _trimmable(cache):
            trim_prompt_cache(cache, reused - limit)
            reused = limit
        if cache is None or reused <= 0 or reused > limit or kv_length(cache) not in (None, reused):
            self.misses += 1
            return None, 0
        self.hits += 1
        self.tokens_reused += reused
        return cache, reused

    def insert(self, tokens: Sequence[int], cache: list[Any]) -> bool:
        """Keep a finished generation's cache for ``tokens`` (prompt and reply).

        ``cache`` must not be used by anyone afterwards. The key is cut to the
        KV length (a generation may stop before its last token was fed).
        Returns whether the entry was kept.
        """
        from mlx_lm.models.cache import trim_prompt_cache

        if self.max_bytes <= 0:
            return False
        tokens = list(tokens)
        length = kv_length(cache)
        if length is not None and length > len(tokens):
            if not _trimmable(cache):
                return False
            trim_prompt_cache(cache, length - len(tokens))
            length = len(tokens)
        if length is not None:
            tokens = tokens[:length]
        if not tokens:
            return False
        entry = compact(cache)
        nbytes = sum(c.nbytes for c in entry)
        if nbytes > self.max_bytes:
            # LRUPromptCache would evict every older entry before dropping it.
            return False
        self._lru.insert_cache(_MODEL_KEY, tokens, entry, cache_type=_CACHE_TYPE)
        self._count()
        return True

    def keep(self, tokens: Sequence[int], cache: list[Any], model: str) -> None:
        """``insert`` for a generation that is already complete: a cache
        problem is logged and must not fail the answer."""
        try:
            self.insert(tokens, cache)
        except Exception:
            log.exception("keeping the prefix cache of a %s generation failed", model)

    def snapshot(self) -> list[Snapshot]:
        """Every entry, most recently used first. The caches are shared, not
        copied: stored entries are never mutated (lookups copy them)."""
        # LRUPromptCache keeps one recency deque per cache type and we use one type.
        order = [list(tokens) for _model, tokens in self._lru._lru._lrus[_CACHE_TYPE]]
        out = []
        for tokens in reversed(order):
            entry = self._lru._trie.get(_MODEL_KEY, tokens)
            out.append(Snapshot(tuple(tokens), entry.prompt_cache, entry.nbytes))
        return out

    def entry_keys(self) -> list[tuple[int, ...]]:
        """The entries' token keys, most recently used first: a read-only
        query for explaining a lookup (``engine/cache_explain.py``)."""
        return [entry.tokens for entry in self.snapshot()]

    def restore(self, entries: Sequence[tuple[Sequence[int], list[Any]]]) -> int:
        """Fill an empty cache with entries read from disk, given most recently
        used first, so that the first ends up the most recent. Returns how
        many entries the cache then holds."""
        for tokens, cache in reversed(list(entries)):
            self.insert(tokens, cache)
        return self.entries

    def clear(self) -> None:
        self._lru.trim_to(n_sequences=0)
        self._count()

    def _count(self) -> None:
        self.entries = len(self._lru)
        self.nbytes = int(self._lru.nbytes)


# ------------------------------------------------------------------ layers
def kv_length(cache: Sequence[Any]) -> int | None:
    """Positions the cache holds, if every layer can say and all agree;
    ``None`` for layer types without a position count (e.g. SSM state)."""
    lengths = set()
    for layer in cache:
        offset = getattr(layer, "offset", None)
        if not isinstance(offset, int):
            return None
        lengths.add(offset)
    return lengths.pop() if len(lengths) == 1 else None


def compact(cache: list[Any]) -> list[Any]:
    """A copy of ``cache`` whose KV arrays hold exactly its length; layer
    types we do not know are kept as they are."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    out: list[Any] = []
    arrays: list[Any] = []
    for layer in cache:
        kind = type(layer)
        if kind is KVCache and layer.keys is not None:
            fresh = KVCache()
            fresh.keys = mx.contiguous(layer.keys[..., : layer.offset, :])
            fresh.values = mx.contiguous(layer.values[..., : layer.offset, :])
            fresh.offset = layer.offset
            arrays += [fresh.keys, fresh.values]
        elif kind is QuantizedKVCache and layer.keys is not None:
            fresh = QuantizedKVCache(group_size=layer.group_size, bits=layer.bits)
            fresh.keys = tuple(mx.contiguous(x[..., : layer.offset, :]) for x in layer.keys)
            fresh.values = tuple(mx.contiguous(x[..., : layer.offset, :]) for x in layer.values)
            fresh.offset = layer.offset
            arrays += [*fresh.keys, *fresh.values]
        else:
            fresh = layer
        out.append(fresh)
    mx.eval(arrays)
    return out


def _trimmable(cache: Sequence[Any]) -> bool:
    from mlx_lm.models.cache import can_trim_prompt_cache

    return bool(cache) and can_trim_prompt_cache(list(cache))


def persistable(cache: Sequence[Any]) -> bool:
    return bool(cache) and all(type(layer).__name__ in PERSISTABLE_LAYERS for layer in cache)


# ----------------------------------------------------------- serialisation
def encode_entry(tokens: Sequence[int], cache: list[Any], fingerprint: str) -> bytes:
    """Safetensors bytes of one entry (``save_prompt_cache`` layout)."""
    from mlx_lm.models.cache import save_prompt_cache

    if not persistable(cache):
        raise EntryError("only KVCache and QuantizedKVCache layers are saved")
    if kv_length(cache) != len(tokens):
        raise EntryError(f"KV length {kv_length(cache)} differs from {len(tokens)} tokens")
    metadata = {
        "mlxd_format": str(CACHE_FORMAT_VERSION),
        "fingerprint": fingerprint,
        "token_count": str(len(tokens)),
        "tokens": encode_tokens(tokens),
    }
    buffer = io.BytesIO()
    save_prompt_cache(buffer, cache, metadata)
    return buffer.getvalue()


def decode_entry(
    payload: bytes, fingerprint: str, expected_tokens: int, layout: KvLayout | None = None
) -> tuple[list[int], list[Any]]:
    """The tokens and cache of ``encode_entry``'s bytes, fully evaluated.

    Raises ``EntryError`` unless the entry belongs to ``fingerprint``, its
    token count, stored tokens and every layer's KV length all equal
    ``expected_tokens`` (what the manifest recorded), and, given the loaded
    model's ``layout``, its layers match it (count, types, head shapes, dtypes).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.cache import load_prompt_cache

    buffer = io.BytesIO(payload)
    buffer.name = "entry.safetensors"  # mx.load picks the format from the name
    try:
        cache, metadata = load_prompt_cache(buffer, return_metadata=True)
        # Arrays are read lazily: evaluate while the buffer is alive.
        mx.eval([a for a in tree_flatten([c.state for c in cache]) if isinstance(a, mx.array)])
    except Exception as exc:
        raise EntryError(f"unreadable entry ({type(exc).__name__})") from exc
    if metadata.get("mlxd_format") != str(CACHE_FORMAT_VERSION):
        raise EntryError(f"format {metadata.get('mlxd_format')!r}, expected {CACHE_FORMAT_VERSION}")
    if metadata.get("fingerprint") != fingerprint:
        raise EntryError("the entry was saved by a different model")
    if not persistable(cache):
        raise EntryError("unexpected cache layer types")
    tokens = decode_tokens(metadata.get("tokens", ""))
    counts = {len(tokens), kv_length(cache), _int(metadata.get("token_count"))}
    for layer in cache:
        counts |= _array_lengths(layer)
    if counts != {expected_tokens}:
        raise EntryError(f"token count / KV length mismatch: {sorted(map(str, counts))}")
    if layout is not None:
        layout.check(cache)
    return tokens, cache


@dataclass(frozen=True)
class KvLayout:
    """What every KV cache of one loaded model looks like, but for its length:
    per layer the cache type and each array's shape (the position axis left
    out) and dtype. The fingerprint says which files wrote an entry; this
    says the entry fits the model that is loaded now. A checksum can be
    recomputed by whoever rewrites a file, and an entry with fewer layers
    would silently run the model on only those (mlx-lm zips layers with the
    cache), so it is checked before any entry is used."""

    layers: tuple[tuple[str, tuple[tuple[tuple[int, ...], str], ...]], ...]

    @classmethod
    def of(cls, cache: Sequence[Any]) -> KvLayout:
        return cls(tuple(_layer_layout(layer) for layer in cache))

    def check(self, cache: Sequence[Any]) -> None:
        """Raises ``EntryError`` naming the first difference."""
        if len(cache) != len(self.layers):
            raise EntryError(f"does not fit the model: {len(cache)} layers, the model has {len(self.layers)}")
        for i, (layer, expected) in enumerate(zip(cache, self.layers)):
            got = _layer_layout(layer)
            if got != expected:
                raise EntryError(f"does not fit the model: layer {i} is {_describe(got)}, "
                                 f"the model's is {_describe(expected)}")


def model_kv_layout(model: Any, kv_bits: int | None, group_size: int = 64) -> KvLayout:
    """The layout of ``model``'s KV cache, read off a one-token forward pass
    (as a generation would build it, quantised with ``kv_bits``). Worker thread."""
    import mlx.core as mx
    from mlx_lm.generate import maybe_quantize_kv_cache
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model(mx.array([[0]]), cache=cache)
    maybe_quantize_kv_cache(cache, 0, group_size, kv_bits)
    mx.eval([c.state for c in cache])
    return KvLayout.of(cache)


def _layer_layout(layer: Any) -> tuple[str, tuple[tuple[tuple[int, ...], str], ...]]:
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    arrays = []
    for part in (keys, values):
        for array in part if isinstance(part, (tuple, list)) else [part]:
            if array is None:
                continue
            shape = tuple(int(d) for d in array.shape)
            # Batch size and position count vary; heads and head size do not.
            arrays.append((shape[1:-2] + shape[-1:], str(array.dtype)))
    return type(layer).__name__, tuple(arrays)


def _describe(layout: tuple[str, tuple[tuple[tuple[int, ...], str], ...]]) -> str:
    kind, arrays = layout
    return f"{kind}[" + ", ".join(f"{'x'.join(map(str, shape))} {dtype}" for shape, dtype in arrays) + "]"


def _array_lengths(layer: Any) -> set[int]:
    quantized = isinstance(layer.keys, (tuple, list))
    arrays = [*layer.keys, *layer.values] if quantized else [layer.keys, layer.values]
    return {int(a.shape[-2]) for a in arrays}


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
