"""A seeded differential fuzz of what a speculative batch does to its cache,
on every cache kind the zoo has: dense (qwen3), its hybrids (qwen3_next,
qwen3_5, lfm2, nemotron_h: state layers beside attention) and its sliding
windows (gemma3_text, gemma4_text, gpt_oss: a 32-token window).

Rows of random lengths (shorter and longer than the window) join and leave
a batch that verifies blocks of random widths, each row keeping a random
number of its positions (its drafts right up to a wrong one), and gives
back the rest as the batch does (``speculative_cache``: trim and holes,
the window's roll, or the state layers' replay). The drafts are the row's
own next tokens, so the logits at every kept position must be those of the
row decoded alone. This found a nemotron_h SSM that ignored the padded
rows' lengths and a window mask one position off after a plain step."""

from __future__ import annotations

import random
from typing import Any

import pytest
from engine.engine_support import spec_for

from mlxd.engine import speculative_cache as caches
from mlxd.engine.speculative_core import rollback

pytestmark = pytest.mark.mlx

FAMILIES = ["qwen3", "qwen3_next", "qwen3_5", "lfm2", "nemotron_h", "gemma3_text", "gemma4_text", "gpt_oss"]
ROUNDS = 6
# Prompt lengths around the 32-token window and well past it.
LENGTHS = (3, 10, 19, 31, 32, 33, 47, 70)
VOCAB = 500


class Row:
    """A sequence, its logits decoded alone, and where the batch is in it."""

    def __init__(self, model: Any, rng: random.Random) -> None:
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        length = rng.choice(LENGTHS)
        self.tokens = [rng.randrange(VOCAB) for _ in range(length + 80)]
        self.alone = model(mx.array(self.tokens)[None], cache=make_prompt_cache(model))[0]
        self.cache = make_prompt_cache(model)
        model(mx.array(self.tokens[: length - 1])[None], cache=self.cache)
        # The row's last input: emitted, not in the cache yet.
        self.at = length - 1

    def block(self, width: int, keep: int, drafts: int) -> list[int]:
        """Its last input and ``drafts`` drafts, the first ``keep - 1`` of them right, padded to ``width``."""
        true = self.tokens[self.at : self.at + 1 + drafts]
        out = true[:keep] + [(t + 1) % VOCAB for t in true[keep:]]
        return out + [out[0]] * (width - len(out))


def _fuzz(model: Any, seed: int) -> list[str]:
    import mlx.core as mx

    rng = random.Random(seed)
    rows = [Row(model, rng) for _ in range(rng.randint(1, 3))]
    cache = caches.merge([r.cache for r in rows])
    history = [f"rows {[r.at + 1 for r in rows]}"]
    for _ in range(rng.randint(4, 14)):
        if rng.random() < 0.2 and len(rows) < 4:
            rows.append(Row(model, rng))
            cache = caches.extend(cache, caches.merge([rows[-1].cache]))
            history.append(f"join {rows[-1].at + 1}")
        if rng.random() < 0.15 and len(rows) > 1:
            gone = rng.randrange(len(rows))
            keep = [i for i in range(len(rows)) if i != gone]
            for layer in cache:
                layer.filter(keep)
            rows = [rows[i] for i in keep]
            history.append(f"leave {gone}")
        width = rng.choice([1, 1, 2, 3, 5])
        drafts = [rng.randint(0, width - 1) for _ in rows]
        kept = [rng.randint(0, d) + 1 for d in drafts]
        history.append(f"block {width} kept {kept}")
        block = mx.array([r.block(width, k, d) for r, k, d in zip(rows, kept, drafts)])
        saved = caches.snapshot(cache) if caches.has_state_layers(cache) and width > 1 else None
        caches.before_block(cache, width)
        logits = model(block, cache=cache)
        for i, (row, k) in enumerate(zip(rows, kept)):
            if not mx.allclose(logits[i, :k], row.alone[row.at : row.at + k], atol=1e-3).item():
                return history + [f"row {i} differs"]
        if saved is not None and min(kept) < width:
            caches.replay(model, cache, saved, block, kept)
        else:
            caches.roll_back(cache, rollback(width, kept))
        for row, k in zip(rows, kept):
            row.at += k
    return []


@pytest.mark.parametrize("family", FAMILIES)
def test_every_kept_position_has_the_logits_of_the_row_alone(family: str) -> None:
    from mlxd.engine.loader import load_text_model
    from mlxd.factory.zoo_build import build_family

    # Loaded as the daemon loads it (the fixes it applies to mlx-lm's models included).
    model = load_text_model(spec_for(build_family(family))).model
    failures = {seed: trace for seed in range(ROUNDS) if (trace := _fuzz(model, seed))}
    assert not failures, failures
