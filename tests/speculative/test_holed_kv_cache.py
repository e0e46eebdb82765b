"""``HoledKVCache`` against mlx-lm's ``BatchKVCache``, on the zoo's qwen3:
after rows give back different numbers of a verified block, a holed cache
(the dropped positions masked where they are) decodes what the rolled one
(every row moved right) decodes, through rows leaving and joining, and a row
leaves with the same cache. The engine tests check the same through the
speculative batch's greedy text; this checks the logits."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.mlx

PROMPTS = [[5, 17, 33, 2, 91, 14, 8], [40, 41, 42], [7, 7, 19, 23, 100, 3]]


@pytest.fixture(scope="module")
def model() -> Any:
    from mlx_lm import load

    from mlxd.factory.zoo_build import build_family

    loaded, _ = load(str(build_family("qwen3")))
    return loaded


def _batch(model: Any, prompts: list[list[int]], holed: bool) -> list[Any]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.engine.holed_kv_cache import HoledKVCache

    singles = []
    for prompt in prompts:
        cache = make_prompt_cache(model)
        model(mx.array(prompt)[None], cache=cache)
        singles.append(cache)
    merged = [singles[0][i].merge([s[i] for s in singles]) for i in range(len(singles[0]))]
    return [HoledKVCache.adopt(m) for m in merged] if holed else merged


def _give_back(cache: list[Any], trim: int, roll: list[int]) -> None:
    for layer in cache:
        layer.trim(trim)
        layer.prepare(right_padding=roll)
        layer.finalize()


def _step(model: Any, cache: list[Any], tokens: list[list[int]]) -> Any:
    import mlx.core as mx

    logits = model(mx.array(tokens), cache=cache)
    mx.eval(logits)
    return logits


def _same(a: Any, b: Any) -> None:
    import mlx.core as mx

    assert a.shape == b.shape
    assert mx.allclose(a, b, atol=1e-4).item(), mx.abs(a - b).max().item()


def test_a_holed_cache_decodes_as_the_rolled_one(model: Any) -> None:
    import mlx.core as mx

    rolled, holed = _batch(model, PROMPTS, False), _batch(model, PROMPTS, True)
    blocks = [[3, 4, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    for _ in range(2):
        # Rows keep 4, 2 and 3 of 5: one common position back, then 0, 2 and 1 more.
        _same(_step(model, rolled, blocks), _step(model, holed, blocks))
        _give_back(rolled, 1, [0, 2, 1])
        _give_back(holed, 1, [0, 2, 1])
    assert holed[0].holes is not None and mx.any(holed[0].holes).item()
    for token in range(20, 24):
        _same(_step(model, rolled, [[token]] * 3), _step(model, holed, [[token]] * 3))
    # The longest row leaves (the others' shared left padding is cut), a new
    # one joins: the holes follow their rows.
    for layer in rolled + holed:
        layer.filter([1, 2])
    joining = [list(range(61, 91))]  # longer than the batch: the batch is padded on its left
    for mine, theirs in zip(rolled, _batch(model, joining, False)):
        mine.extend(theirs)
    for mine, theirs in zip(holed, _batch(model, joining, False)):
        mine.extend(theirs)
    for token in range(30, 33):
        _same(_step(model, rolled, [[token]] * 3), _step(model, holed, [[token]] * 3))
    # A row leaves as a one-sequence cache of its own tokens only.
    for row in range(3):
        for a, b in zip(rolled, holed):
            left, right = a.extract(row), b.extract(row)
            assert left.offset == right.offset
            # Equal to float32 noise: past the first layer, each cache's keys come
            # from attention over its own layout of the same positions.
            _same(left.keys[..., : left.offset, :], right.keys[..., : right.offset, :])
            _same(left.values[..., : left.offset, :], right.values[..., : right.offset, :])


def test_a_holed_cache_leaves_the_other_rows_where_they_are(model: Any) -> None:
    """What the roll cost: every row of every layer moved. Here only masks change."""
    holed = _batch(model, PROMPTS, True)
    _step(model, holed, [[3, 4, 5], [6, 7, 8], [9, 10, 11]])
    before = [layer.keys for layer in holed]
    _give_back(holed, 0, [2, 0, 1])
    assert all(layer.keys is key for layer, key in zip(holed, before))
    # Each row's RoPE position is its own token count again.
    assert holed[0].offset.tolist() == [len(p) + 3 - r for p, r in zip(PROMPTS, [2, 0, 1])]
