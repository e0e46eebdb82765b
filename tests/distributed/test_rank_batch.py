"""A rank's continuous batch (``distributed/rank_batch.py``) on the zoo's
real cache kinds: rows that join and leave at different steps decode
exactly what each decodes alone, on a dense model, a hybrid one (linear
attention's state merged and split with the KV) and a sliding-window one
(prompts longer than the window, so it has rotated)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from zoo.zoo_support import zoo_model

from mlxd.distributed.rank_batch import Row, RowBatch
from mlxd.engine.cache_layers import mergeable

pytestmark = pytest.mark.mlx

# Distinct prompts of different lengths, longer than the sliding window (32 in the zoo).
PROMPTS = [[(7 * i + 3 * j) % 200 + 10 for j in range(n)] for i, n in enumerate((41, 23, 57))]
STEPS = 10


def _first_step(model, prompt: list[int]) -> tuple[list, int]:
    """The prompt in a fresh cache, all but its last token, then that one
    run as the first decode step: the cache and the first greedy token."""
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    logits = model(mx.array(prompt[-1:])[None], cache=cache)[:, -1, :]
    return cache, int(mx.argmax(logits, axis=-1).item())


def _alone(model, prompt: list[int], steps: int) -> list[int]:
    cache, token = _first_step(model, prompt)
    tokens = [token]
    for _ in range(steps - 1):
        logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
        token = int(mx.argmax(logits, axis=-1).item())
        tokens.append(token)
    return tokens


@pytest.fixture(scope="module", params=["qwen3", "qwen3_next", "gemma3_text"])
def model(request):
    loaded, _ = load_model(zoo_model(request.param))
    return loaded


def test_rows_joining_and_leaving_a_batch_decode_what_they_decode_alone(model):
    assert mergeable(make_prompt_cache(model))
    alone = [_alone(model, p, STEPS) for p in PROMPTS]
    # Row 0 decodes alone first, row 1 joins after 2 steps, row 2 after 4;
    # row 1 stops 3 steps early, so the batch shrinks while the others go on.
    joins = {0: 0, 2: 1, 4: 2}
    lengths = [STEPS, STEPS - 3, STEPS]
    batch = RowBatch()
    got: dict[int, list[int]] = {}
    kept: dict[int, list] = {}
    index: dict[int, int] = {}  # row id -> prompt index
    for step in range(3 * STEPS):
        if step in joins:
            i = joins[step]
            cache, token = _first_step(model, PROMPTS[i])
            row = Row(str(i), len(PROMPTS[i]), lengths[i], keep_as=i, token=token, step=1)
            got[i] = [token]
            index[id(row)] = i
            batch.join(row, cache)
        if not len(batch):
            break
        logits = model(batch.inputs(), cache=batch.cache)[:, -1, :]
        picked = mx.argmax(logits, axis=-1).tolist()
        leaving = set()
        for n, (row, token) in enumerate(zip(batch.rows, picked)):
            i = index[id(row)]
            row.token, row.step = int(token), row.step + 1
            got[i].append(int(token))
            if row.step >= row.max_tokens:
                leaving.add(n)
        rows = list(batch.rows)
        for n, cache in batch.leave(leaving).items():
            kept[index[id(rows[n])]] = cache
        assert batch.merged == (len(batch) > 1)  # alone, a row decodes on its own cache
    assert [got[i] for i in range(3)] == [a[:n] for a, n in zip(alone, lengths)]
    # What a row leaves behind is its own cache, good for its next turn: the
    # prompt and every token but the last, as the prefix cache keeps it.
    for i, cache in kept.items():
        token = got[i][-1]
        logits = model(mx.array([[token]]), cache=cache)[:, -1, :]
        assert int(mx.argmax(logits, axis=-1).item()) == _alone(model, PROMPTS[i], lengths[i] + 1)[-1]
