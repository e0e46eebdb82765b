"""Per-token log-probabilities for a request that asks for them (OpenAI's
``logprobs`` / ``top_logprobs``). Worker thread: they come from the
distribution mlx-lm sampled from (after penalties and the grammar's mask)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# OpenAI's own bound on top_logprobs.
MAX_TOP = 20


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    # The ``top`` most likely tokens at this step, most likely first.
    top: tuple[tuple[str, float], ...] = ()


def token_logprob(tokenizer: Any, token: int, logprobs: Any, top: int) -> TokenLogprob:
    """The entry for ``token`` drawn from ``logprobs`` (the step's
    log-softmax over the vocabulary)."""
    import mlx.core as mx

    row = logprobs.reshape(-1).astype(mx.float32)
    alternatives: tuple[tuple[str, float], ...] = ()
    if top > 0:
        k = min(top, row.size)
        ids = mx.argpartition(-row, kth=k - 1)[:k]
        values = row[ids].tolist()
        pairs = sorted(zip(ids.tolist(), values), key=lambda p: -p[1])
        # Tokens a grammar masked out (-inf) are no alternatives (nor valid JSON).
        alternatives = tuple((tokenizer.decode([i]), float(v)) for i, v in pairs if math.isfinite(v))
    return TokenLogprob(tokenizer.decode([token]), float(row[token].item()), alternatives)
