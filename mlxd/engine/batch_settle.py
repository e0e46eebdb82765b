"""A batch whose rows changed is evaluated on its own before its next step.

When rows leave a batch (``filter``) or join it (``extend``), mlx-lm and
mlxd's speculative batch rearrange the batch's caches lazily: gathers, pads
and concatenations that the next decode step's graph would evaluate first.
On a CUDA device MLX records a step as CUDA graphs of a hundred operations
each and reuses a recorded graph when the next step's operations have the
same shape (``CommandEncoder::commit``: the key is the sequence of nodes and
their edges). The rearranging operations shift every boundary of the step
that follows, so none of its graphs is found and each is instantiated anew.
Evaluating the rearranged state in its own call (queued, not waited for)
gives the step the same operations as any other step of its batch size, so
its graphs are found again. On an H100 (bench/composition_steps.py, 4 rows,
one leaving and one joining every 9 steps) the second step after a change
went from 10.9 ms median and 20.2 ms at worst to 8.2 and 9.4, against 7.6
for a steady step; the change itself and the step that moves a joining row
in are mlx-lm's join and stay as long (docs/batching.md).
"""

from __future__ import annotations

from typing import Any


def rearranged_arrays(caches: list[Any] | None, *more: Any) -> list[Any]:
    """The arrays of a batch's caches (any cache kind: its ``state``) and
    of ``more`` (arrays or lists of them, None skipped)."""
    import mlx.core as mx

    found: list[Any] = []

    def collect(value: Any) -> None:
        if isinstance(value, mx.array):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)

    for cache in caches or ():
        collect(cache.state)
    for value in more:
        collect(value)
    return found


def evaluate_soon(caches: list[Any] | None, *more: Any) -> None:
    """Queues the evaluation of ``rearranged_arrays(caches, *more)``, not waited for."""
    import mlx.core as mx

    arrays = rearranged_arrays(caches, *more)
    if arrays:
        mx.async_eval(arrays)


def settle(generator: Any) -> None:
    """Queues the evaluation of ``generator``'s batch state: mlx-lm's
    ``BatchGenerator`` (its generation batch) or one with a ``settle``
    method of its own (the speculative batch)."""
    own = getattr(generator, "settle", None)
    if own is not None:
        own()
        return
    # mlx-lm's generation batch is private: read defensively, so that a
    # release that renames it costs this optimisation, never a generation.
    batch = getattr(generator, "_generation_batch", None)
    if batch is None:
        return
    evaluate_soon(getattr(batch, "prompt_cache", None), getattr(batch, "_next_tokens", None),
                  getattr(batch, "_next_logprobs", None))
