"""What the prefix cache needs to know about each kind of mlx-lm cache layer.

mlx-lm gives each model the caches its architecture needs: ``KVCache`` (full
attention, MLA's compressed latent too), ``QuantizedKVCache`` (``kv_bits``),
``RotatingKVCache`` (sliding-window attention: Gemma 3/4, gpt-oss),
``ArraysCache`` (the fixed-size state of linear attention and SSM layers:
Qwen3-Next/3.5, Nemotron-H, LFM2, Kimi Linear), ``ChunkedKVCache``,
``ConcatenateKVCache`` and ``CacheList`` (several of those side by side in
one layer, e.g. Falcon-H1's mamba + attention). They differ in what the
prefix cache relies on:

- *positions*: how many tokens a layer holds. KV-like layers count them
  (``offset``); an ``ArraysCache`` cannot say, its state is the same size
  after ten tokens or ten thousand;
- *trimming*: a full KV cache can be cut back to any shorter prefix, so one
  entry serves every prefix of it. A rotating cache can only until it first
  wraps (older positions are overwritten), an ``ArraysCache`` never (the
  state of an earlier position is gone). An entry that cannot be trimmed
  serves exactly its own tokens, which is why such models keep checkpoints;
- *compacting*: the copy that is kept holds exactly what the layer needs,
  in new array objects (mlx-lm updates some arrays in place, so an entry
  must never share an array object with a live cache).

Worker thread (MLX).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

# Layer classes ``mlx_lm.models.cache.load_prompt_cache`` can rebuild from a
# file (it looks the class name up in that module).
PERSISTABLE_LAYERS = frozenset({
    "KVCache", "QuantizedKVCache", "RotatingKVCache", "ArraysCache", "CacheList",
    "ChunkedKVCache", "ConcatenateKVCache",
})
# Layers whose arrays' second-last axis is the position axis.
_KV_LIKE = frozenset({"KVCache", "QuantizedKVCache", "RotatingKVCache", "ChunkedKVCache", "ConcatenateKVCache"})

# A cache whose layers disagree on their position count: never a token count.
DISAGREE = -1


def _children(layer: Any) -> Sequence[Any] | None:
    return getattr(layer, "caches", None) if type(layer).__name__ == "CacheList" else None


def positions(cache: Sequence[Any]) -> int | None:
    """Tokens the cache holds, as its position-counting layers say; ``None``
    when no layer counts (a pure SSM state), ``DISAGREE`` when they differ."""
    seen: set[int] = set()
    _collect_positions(cache, seen)
    if not seen:
        return None
    return seen.pop() if len(seen) == 1 else DISAGREE


def _collect_positions(layers: Sequence[Any], seen: set[int]) -> None:
    for layer in layers:
        children = _children(layer)
        if children is not None:
            _collect_positions(children, seen)
            continue
        offset = getattr(layer, "offset", None)
        if type(layer).__name__ in _KV_LIKE and isinstance(offset, int):
            seen.add(offset)


def can_trim(cache: Sequence[Any], n: int) -> bool:
    """Whether every layer can drop its last ``n`` tokens exactly."""
    return bool(cache) and all(_layer_can_trim(layer, n) for layer in cache)


def _layer_can_trim(layer: Any, n: int) -> bool:
    if n <= 0:
        return True
    children = _children(layer)
    if children is not None:
        return all(_layer_can_trim(c, n) for c in children)
    name = type(layer).__name__
    offset = getattr(layer, "offset", 0)
    if name in ("KVCache", "QuantizedKVCache", "ConcatenateKVCache"):
        return n <= offset
    if name == "RotatingKVCache":
        # Before it first wraps it holds every position in order.
        return offset < layer.max_size and n <= offset
    if name == "ChunkedKVCache":
        return layer.start_position == 0 and n <= offset
    return False


def trim(cache: Sequence[Any], n: int) -> None:
    """Drop the last ``n`` tokens of every layer (``can_trim`` first)."""
    for layer in cache:
        layer.trim(n)


def may_outgrow_trimming(cache: Sequence[Any]) -> bool:
    """Whether a cache of this model can reach a state that cannot be
    trimmed (sliding windows, SSM state): then it keeps checkpoints."""
    for layer in cache:
        children = _children(layer)
        if children is not None:
            if may_outgrow_trimming(children):
                return True
        elif type(layer).__name__ not in ("KVCache", "QuantizedKVCache", "ConcatenateKVCache"):
            return True
    return False


def compact(cache: Sequence[Any]) -> list[Any]:
    """A private copy of ``cache`` for keeping: KV arrays cut to their
    length, every array a new object, queued for evaluation. Not waited
    for: the copies queue behind the batch's step computed ahead, so waiting
    here held the turn that ended a request for a whole step, with the
    host work that would have overlapped it (an interactive request
    arriving then waited for both). Once evaluated, the copies let go of the
    batch's arrays."""
    import mlx.core as mx

    out = [_compact_layer(layer) for layer in cache]
    mx.async_eval(arrays_of(out))
    return out


def prefix_copy(cache: Sequence[Any], length: int) -> list[Any] | None:
    """A private copy of the first ``length`` positions of ``cache`` (and
    room for the next few), made of those positions only, where every layer
    is a plain or quantized KV cache and that is under half of it; None
    otherwise (copy the whole and ``trim``). A short prompt found at the
    start of a long entry (a system prompt, the first turns of a long
    conversation) then copies what it reuses, not the whole entry: 256
    positions of a 4,096-token entry of the factory's small qwen2 took 2.1
    MB at peak instead of 16.8, and the fetch and a first token 9.4 ms
    instead of 12.4 on this CPU. Reusing most of an entry gains nothing
    this way (the whole is shared, then copied once by the first update).
    Not evaluated: the request's prefill reads it."""
    from mlx_lm.models import cache as mc

    def layer_copy(layer: Any) -> Any:
        children = _children(layer)
        if children is not None:
            parts = [layer_copy(c) for c in children]
            return None if any(p is None for p in parts) else mc.CacheList(*parts)
        if type(layer) not in (mc.KVCache, mc.QuantizedKVCache) or layer.keys is None or layer.offset < length:
            return None
        # Room for the next ``step`` positions as well, where the entry has
        # them: an exact cut would be copied again (grown) by the prefill's
        # first update, where a shared whole entry is copied once.
        capacity = _keys_of(layer).shape[2]
        room = min(capacity, length + getattr(layer, "step", 256))
        if 2 * room > capacity:
            return None  # most of it: the whole, shared, costs no more
        return _kv_head(layer, room, length)

    out = [layer_copy(layer) for layer in cache]
    return None if any(layer is None for layer in out) else out


def _kv_head(layer: Any, end: int, offset: int) -> Any:
    """A new plain or quantized KV layer holding copies of ``layer``'s first
    ``end`` positions, ``offset`` of them in use."""
    from mlx_lm.models import cache as mc

    if type(layer) is mc.KVCache:
        fresh = mc.KVCache()
        if layer.keys is not None:
            fresh.keys = _fresh(layer.keys[..., :end, :])
            fresh.values = _fresh(layer.values[..., :end, :])
    else:
        fresh = mc.QuantizedKVCache(group_size=layer.group_size, bits=layer.bits)
        if layer.keys is not None:
            fresh.keys = tuple(_fresh(x[..., :end, :]) for x in layer.keys)
            fresh.values = tuple(_fresh(x[..., :end, :]) for x in layer.values)
    fresh.offset = offset
    return fresh


def _keys_of(layer: Any) -> Any:
    """A KV layer's keys array (a quantized one's first part)."""
    return layer.keys[0] if isinstance(layer.keys, tuple) else layer.keys


def _fresh(x: Any) -> Any:
    import mlx.core as mx

    return None if x is None else mx.array(x)


def _compact_layer(layer: Any) -> Any:
    from mlx_lm.models import cache as mc

    children = _children(layer)
    if children is not None:
        return mc.CacheList(*(_compact_layer(c) for c in children))
    kind = type(layer)
    if kind in (mc.KVCache, mc.QuantizedKVCache):
        return _kv_head(layer, layer.offset, layer.offset)
    if kind is mc.RotatingKVCache:
        fresh = mc.RotatingKVCache(max_size=layer.max_size, keep=layer.keep)
        fresh.offset, fresh._idx = layer.offset, layer._idx
        if layer.keys is not None:
            keys, values = layer.keys, layer.values
            if layer._idx == layer.offset <= keys.shape[2]:
                # Never wrapped: the first ``offset`` positions, in order, are all of it.
                keys, values = keys[..., : layer.offset, :], values[..., : layer.offset, :]
            # Wrapped: kept as it is, so that continuing from the copy is
            # exactly continuing from the original.
            fresh.keys, fresh.values = _fresh(keys), _fresh(values)
        return fresh
    if kind is mc.ArraysCache:
        fresh = mc.ArraysCache(len(layer.cache))
        fresh.cache = [_fresh(x) for x in layer.cache]
        # Batch bookkeeping (left padding, lengths) belongs to the batch it came from.
        return fresh
    return copy.deepcopy(layer)


def arrays_of(cache: Sequence[Any]) -> list[Any]:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    return [a for _, a in tree_flatten([c.state for c in cache]) if isinstance(a, mx.array)]


def nbytes(cache: Sequence[Any]) -> int:
    return sum(int(layer.nbytes) for layer in cache)


def mergeable(cache: Sequence[Any]) -> bool:
    """Whether every layer can join a batch (mlx-lm's batch caches: what its
    server asks before batching a model)."""
    return bool(cache) and all(hasattr(layer, "merge") for layer in cache)


def persistable(cache: Sequence[Any]) -> bool:
    return bool(cache) and all(_layer_persistable(layer) for layer in cache)


def _layer_persistable(layer: Any) -> bool:
    children = _children(layer)
    if children is not None:
        return all(_layer_persistable(c) for c in children)
    return type(layer).__name__ in PERSISTABLE_LAYERS


# ------------------------------------------------------------------ layout
Layout = tuple[Any, ...]


def layer_layout(layer: Any) -> Layout:
    """A layer's type and each array's shape and dtype, leaving out what
    varies between entries of one model: the batch axis and, for KV-like
    layers, the position axis. A sliding window's size is part of it."""
    children = _children(layer)
    name = type(layer).__name__
    if children is not None:
        return (name, tuple(layer_layout(c) for c in children))
    kv_like = name in _KV_LIKE
    arrays = []
    for array in _layer_arrays(layer):
        shape = tuple(int(d) for d in array.shape)
        kept = shape[1:-2] + shape[-1:] if kv_like and len(shape) >= 3 else shape[1:]
        arrays.append((kept, str(array.dtype)))
    extra = (int(layer.max_size), int(layer.keep)) if name == "RotatingKVCache" else ()
    return (name, tuple(arrays), extra)


def _layer_arrays(layer: Any) -> list[Any]:
    import mlx.core as mx

    if type(layer).__name__ == "ArraysCache":
        return [a for a in layer.cache if isinstance(a, mx.array)]
    out = []
    for part in (getattr(layer, "keys", None), getattr(layer, "values", None)):
        for array in part if isinstance(part, (tuple, list)) else [part]:
            if isinstance(array, mx.array):
                out.append(array)
    return out


def describe(layout: Layout) -> str:
    name, inner = layout[0], layout[1]
    if name == "CacheList":
        return "CacheList(" + ", ".join(describe(c) for c in inner) + ")"
    text = ", ".join(f"{'x'.join(map(str, shape))} {dtype}" for shape, dtype in inner)
    window = f" window {layout[2][0]}" if len(layout) > 2 and layout[2] else ""
    return f"{name}[{text}]{window}"


def array_lengths_agree(cache: Sequence[Any], n: int) -> bool:
    """Whether every full KV layer's arrays hold exactly ``n`` positions (what
    ``compact`` leaves), so a file's arrays cannot disagree with its count."""
    for layer in cache:
        children = _children(layer)
        if children is not None:
            if not array_lengths_agree(children, n):
                return False
            continue
        if type(layer).__name__ in ("KVCache", "QuantizedKVCache"):
            if any(int(a.shape[-2]) != n for a in _layer_arrays(layer)):
                return False
        elif type(layer).__name__ == "RotatingKVCache":
            # Never more positions than tokens, nor than the window once wrapped.
            if any(int(a.shape[-2]) > max(n, layer.max_size) for a in _layer_arrays(layer)):
                return False
    return True
