"""A batch's KV cache rolled back per sequence after a verified block.

Every row of a batch verifies its block of K + 1 positions in one forward
pass, and each keeps a different number of them. Three kinds of layers:

- full-attention layers can drop positions: all rows together by ``trim``,
  and one row's last n as holes (``HoledKVCache``, mlx-lm's ``BatchKVCache``
  whose right-padding step masks them where they are, rather than rolling
  the whole cache right to make them left padding);
- ``BatchRotatingKVCache`` (sliding-window attention: Gemma 3/4, gpt-oss)
  verifies its block through mlx-lm's concatenating update, which leaves the
  buffer in temporal order holding the window's last ``max_size - 1``
  positions and the whole block. A row that keeps ``k`` of the block still
  has ``max_size - 1 + k`` positions, at least a full window, so dropping the
  rest is exact however far the window has wrapped: the dropped positions
  are cut from the buffer's end (mlx-lm's ``trim`` only moves its counters,
  and the next one-token step's front trim would keep them as the newest
  context) and one row's are rolled to its front as left padding (mlx-lm's
  right-padding step: a copy of the window, which bounds it);
- state layers (``ArraysCache``: linear attention, SSMs) hold no positions:
  their state after the kept tokens is not in the cache at all. They are
  snapshotted before the block; a row that did not keep its whole block
  makes the batch restore the snapshot, drop the whole block from the
  attention layers, and replay the kept tokens (right-padded, with each row's
  length, as mlx-lm prefills a batch).

Worker thread (MLX).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlxd.engine.speculative_core import Rollback

# Layer classes of make_prompt_cache a speculative batch can roll back.
SUPPORTED = frozenset({"KVCache", "RotatingKVCache", "ArraysCache"})


def unsupported_layers(cache: Sequence[Any]) -> set[str]:
    """The layer types of a single-sequence cache that cannot be rolled back here."""
    return {type(layer).__name__ for layer in cache} - SUPPORTED


def has_state_layers(cache: Sequence[Any]) -> bool:
    return any(type(layer).__name__ == "ArraysCache" for layer in cache)


def snapshot(cache: Sequence[Any]) -> list[Any]:
    """The state layers' contents (mlx-lm rebinds their arrays, never writes
    into them, so holding the references is a copy)."""
    return [
        (list(layer.cache), layer.lengths, layer.left_padding) if type(layer).__name__ == "ArraysCache" else None
        for layer in cache
    ]


def roll_back(cache: Sequence[Any], plan: Rollback) -> None:
    """Drop what the rows did not keep from attention layers only."""
    import mlx.core as mx

    if plan.trim:
        for layer in cache:
            _drop_last(layer, plan.trim)
    if plan.uniform:
        return
    for layer in cache:
        kind = type(layer).__name__
        if kind in ("HoledKVCache", "BatchKVCache"):  # holes, or mlx-lm's roll
            layer.prepare(right_padding=list(plan.roll))
            layer.finalize()
        elif kind == "BatchRotatingKVCache":
            # Its prepare counts ``lengths`` from the row's offset now: the
            # row's real end is ``roll`` positions before it.
            layer.prepare(lengths=[-r for r in plan.roll], right_padding=list(plan.roll))
            layer.finalize()
    mx.eval([layer.state for layer in cache])


def before_block(cache: Sequence[Any], width: int) -> None:
    """A batch cache made ready for a block of ``width`` positions per row.

    A one-token step rotates a full sliding window in place; the next block
    of several positions goes through mlx-lm's concatenating update, which
    first puts the window back in temporal order and then trims its front.
    The attention mask is built before that update, from the rotated
    counters: it trimmed nothing, so a row shorter than the window (left
    padding) had its oldest position masked out and every later one shifted,
    and its tokens drifted from decoding it alone once a verify step
    followed a plain one. In temporal order first, the mask and the update
    trim the same positions (the same roll the update would make)."""
    if width < 2:
        return
    for layer in cache:
        if type(layer).__name__ == "BatchRotatingKVCache" and layer.rotated:
            layer._temporal_order()


def _drop_last(layer: Any, n: int) -> None:
    """The last ``n`` positions of every row out of an attention layer."""
    layer.trim(n)
    if type(layer).__name__ == "BatchRotatingKVCache":
        if layer.rotated:
            # Only a one-token step rotates the buffer, and a block of one drops nothing.
            raise RuntimeError("a rotated sliding-window cache cannot drop positions from its end")
        layer.keys = layer.keys[..., : layer._idx, :]
        layer.values = layer.values[..., : layer._idx, :]


def replay(model: Any, cache: Sequence[Any], saved: list[Any], block: Any, kept: Sequence[int]) -> None:
    """A hybrid cache back to the kept tokens: the state layers restored,
    the attention layers cut back by the whole block, then the kept inputs
    of each row fed again (``block``: the (rows, positions) inputs verified)."""
    import mlx.core as mx

    width = int(block.shape[1])
    for layer, state in zip(cache, saved):
        if state is None:
            _drop_last(layer, width)
        else:
            layer.cache, layer.lengths, layer.left_padding = list(state[0]), state[1], state[2]
    longest = max(kept)
    padding = [longest - k for k in kept]
    if any(padding):
        for layer in cache:
            layer.prepare(lengths=list(kept), right_padding=padding)
    before_block(cache, longest)
    model(block[:, :longest], cache=cache)
    if any(padding):
        for layer in cache:
            layer.finalize()
    mx.eval([layer.state for layer in cache])


# What a BatchRotatingKVCache is, besides its arrays' contents: saved and put back whole.
_ROTATING_FIELDS = ("keys", "values", "offset", "left_padding", "_idx", "_offset", "rotated", "_lengths")


def save_unrollable(cache: Sequence[Any]) -> list[Any] | None:
    """A draft's sliding-window and state layers as they are now, before
    one-token steps that cannot be given back (a rotating buffer is written
    in place, so its arrays are copied; a state layer's are rebound, so
    holding them is a copy); None for a cache of full-attention layers only."""
    import mlx.core as mx

    saved: list[Any] = []
    for layer in cache:
        kind = type(layer).__name__
        if kind == "BatchRotatingKVCache":
            saved.append({name: mx.array(v) if isinstance(v, mx.array) else v
                          for name in _ROTATING_FIELDS for v in [getattr(layer, name)]})
        elif kind == "ArraysCache":
            saved.append((list(layer.cache), layer.lengths, layer.left_padding))
        else:
            saved.append(None)
    return saved if any(s is not None for s in saved) else None


def put_back(cache: Sequence[Any], saved: list[Any], steps: int) -> None:
    """``save_unrollable``'s layers restored, and ``steps`` one-token steps
    trimmed from every full-attention layer."""
    for layer, state in zip(cache, saved):
        if state is None:
            _drop_last(layer, steps)
        elif isinstance(state, dict):
            for name, value in state.items():
                setattr(layer, name, value)
        else:
            layer.cache, layer.lengths, layer.left_padding = list(state[0]), state[1], state[2]


def merge(caches: Sequence[Sequence[Any]]) -> list[Any]:
    """Single-sequence caches as one batch cache, layer by layer (full
    attention as ``HoledKVCache``)."""
    from mlxd.engine.holed_kv_cache import HoledKVCache

    merged = [caches[0][i].merge([c[i] for c in caches]) for i in range(len(caches[0]))]
    return [HoledKVCache.adopt(m) if type(m).__name__ == "BatchKVCache" else m for m in merged]


def extend(batch: list[Any] | None, more: list[Any]) -> list[Any]:
    if not batch:
        return more
    for mine, theirs in zip(batch, more):
        mine.extend(theirs)
    return batch
