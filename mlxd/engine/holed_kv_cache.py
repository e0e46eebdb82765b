"""A batch KV cache that gives back one row's last positions without moving the others.

A speculative batch verifies a block of positions in every row, and each row
keeps a different number of them. mlx-lm's ``BatchKVCache`` drops one row's
last n positions by rolling every row of every layer right (``finalize``
after a right-padded input: the dropped positions become left padding). That
roll is a gather over the whole cache, and it grows with the context: on
this project's CPU, a step's cache work for 4 rows of a SmolLM2-shaped cache
at 2k tokens took 494 ms with it and 132 ms without
(``bench/speculative_rollback.py``), so batched speculation could not pay.

``HoledKVCache`` marks the dropped positions as holes instead: they stay
where they are, the attention mask hides them from then on, and the row's
offset (its RoPE position) goes back by n. The buffer grows exactly as with
the roll (by the longest row's kept positions a step); what was left padding
is now a hole in the middle of the row, and stays while the row is in the
batch (the roll's left padding was cut when a row left and every remaining
row had some, which rows of a long batch seldom all do). A row that leaves the batch
(``extract``) is copied without its holes, so the prefix cache holds the
same tokens as before.

Worker thread (MLX).
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import BatchKVCache, KVCache


class HoledKVCache(BatchKVCache):
    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        # (rows, n) booleans, n <= _idx: True where a row's position holds
        # nothing. Positions past n hold something. None: no holes at all.
        self.holes: Any = None

    @classmethod
    def adopt(cls, batch: BatchKVCache) -> HoledKVCache:
        """``batch``'s rows and arrays (shared, not copied) in a holed cache."""
        cache = cls.__new__(cls)
        cache.__dict__.update(batch.__dict__)
        cache.holes = None
        return cache

    def _holes(self, width: int) -> Any:
        import mlx.core as mx

        holes = self.holes
        if holes.shape[1] >= width:
            return holes[:, :width]
        return mx.pad(holes, [(0, 0), (0, width - holes.shape[1])])

    def finalize(self) -> None:
        """The right padding of the last input (each row's last
        ``right_padding[i]`` positions) becomes holes."""
        import mlx.core as mx

        padding = self._right_padding
        if padding is None:
            return
        self._right_padding = None
        fresh = mx.arange(self._idx)[None] >= (self._idx - padding)[:, None]
        self.holes = fresh if self.holes is None else self._holes(self._idx) | fresh
        self.offset = self.offset - padding

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        if self.holes is None:
            return mask
        return mask & ~self._holes(self._idx + N)[:, None, None, :]

    def trim(self, n: int) -> int:
        n = super().trim(n)
        if self.holes is not None:
            self.holes = self.holes[:, : self._idx]
        return n

    def filter(self, batch_indices: Any) -> None:
        before = self._idx
        super().filter(batch_indices)
        if self.holes is not None:
            # The base class drops the left padding all remaining rows share.
            self.holes = self.holes[batch_indices][:, before - self._idx :]

    def extend(self, other: Any) -> None:
        import mlx.core as mx

        theirs = getattr(other, "holes", None)
        if self.holes is None and theirs is None:
            super().extend(other)
            return
        rows = (int(self.offset.shape[0]), int(other.offset.shape[0]))
        widths = (self._idx, other._idx)
        ours = self.holes
        super().extend(other)

        def aligned(holes: Any, count: int, width: int) -> Any:
            # Left-justified as the base class pads the keys: by the difference in length.
            if holes is None:
                return mx.zeros((count, self._idx), dtype=mx.bool_)
            holes = holes[:, :width]
            return mx.pad(holes, [(0, 0), (self._idx - width, width - holes.shape[1])])

        self.holes = mx.concatenate([aligned(ours, rows[0], widths[0]), aligned(theirs, rows[1], widths[1])])

    def extract(self, idx: int) -> KVCache:
        """Row ``idx`` as a one-sequence cache, its holes left out."""
        import mlx.core as mx

        if self.holes is None:
            return super().extract(idx)
        mx.eval(self.left_padding, self.holes)
        start = self.left_padding.tolist()[idx]
        row = self._holes(self._idx)[idx].tolist()
        kept = [p for p in range(start, self._idx) if not row[p]]
        if len(kept) == self._idx - start:
            return super().extract(idx)
        where = mx.array(kept)
        cache = KVCache()
        cache.keys = mx.contiguous(mx.take(self.keys[idx : idx + 1], where, axis=2))
        cache.values = mx.contiguous(mx.take(self.values[idx : idx + 1], where, axis=2))
        cache.offset = cache.keys.shape[2]
        return cache
