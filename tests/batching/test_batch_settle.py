"""Settling a batch after rows join or leave (engine/batch_settle.py) only
moves when its rearranged caches are evaluated: on a dense model, a hybrid
one (linear-attention state beside KV) and a sliding-window one, greedy
rows give the same tokens with and without it, and every layer's state is
among what it evaluates."""

from __future__ import annotations

from typing import Any

import pytest

from mlxd.engine.batch_settle import rearranged_arrays, settle

pytestmark = pytest.mark.mlx


def _tokens(model: Any, settled: bool) -> tuple[dict[int, list[int]], list[Any]]:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    greedy = make_sampler(temp=0.0)

    def prefilled(length: int, seed: int) -> tuple[list[Any], list[int]]:
        tokens = [(seed * 13 + i) % 200 + 5 for i in range(length)]
        cache = make_prompt_cache(model)
        model(mx.array(tokens[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        return cache, tokens

    generator = BatchGenerator(model, completion_batch_size=4, prefill_batch_size=4, prefill_step_size=64)
    out: dict[int, list[int]] = {}

    def join(rows: list[tuple[list[Any], list[int]]]) -> list[int]:
        return generator.insert([[t[-1]] for _, t in rows], max_tokens=[10**6] * len(rows),
                                caches=[c for c, _ in rows], samplers=[greedy] * len(rows))

    def step() -> None:
        _, responses = generator.next()
        for r in responses:
            out.setdefault(r.uid, []).append(r.token)
        if settled:
            settle(generator)

    uids = join([prefilled(20 + 3 * i, i) for i in range(3)])
    for _ in range(4):
        step()
    generator.remove([uids[1]])  # a row leaves a batch that goes on
    if settled:
        settle(generator)
    join([prefilled(17, 9)])  # and another joins it
    for _ in range(6):
        step()
    caches = list(generator._generation_batch.prompt_cache)
    generator.close()
    return out, caches


@pytest.mark.parametrize("family", ["qwen3", "qwen3_next", "gemma3_text"])
def test_settling_changes_no_token_and_reaches_every_layers_state(family: str) -> None:
    from mlx_lm import load

    from mlxd.factory.zoo_build import build_family

    model, _ = load(str(build_family(family)))
    plain, _ = _tokens(model, settled=False)
    settled, caches = _tokens(model, settled=True)
    assert settled == plain
    # Four rows: three from the start (one left after 4 steps), one joined later.
    assert len(plain) == 4 and all(len(t) >= 3 for t in plain.values())

    def arrays_in(state: Any) -> int:
        import mlx.core as mx

        if isinstance(state, mx.array):
            return 1
        return sum(arrays_in(s) for s in state) if isinstance(state, (list, tuple)) else 0

    assert len(rearranged_arrays(caches)) == sum(arrays_in(c.state) for c in caches) > len(caches)


def test_a_generator_without_a_batch_of_mlx_lm_is_left_alone() -> None:
    class Other:
        pass

    settle(Other())  # no generation batch to settle: nothing happens, nothing raises
