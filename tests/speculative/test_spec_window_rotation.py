"""A speculative batch on sliding-window layers (the zoo's Gemma 3 and
gpt-oss: a 32-token window) that goes from plain one-token steps to
verifying drafts gives a row shorter than the window the tokens it gets
decoded alone.

A plain step rotates the full window in place. The next verify block goes
through mlx-lm's concatenating update, which first puts the window back in
temporal order and trims its front; its attention mask was built before,
from the rotated counters, so it trimmed nothing: the short row (left
padding in the batch) lost its oldest position from the mask and every
later one moved by one. In the daemon, a greedy request beside a longer
prompt drifted from its plain text once its batch verified drafts after a
plain step."""

from __future__ import annotations

import random
from typing import Any

import pytest
from speculative.test_spec_step_accounting import AlwaysDrafts, NeverDrafts, Recorder

pytestmark = pytest.mark.mlx


def _decode(model: Any, prompts: list[list[int]], drafter: Any, choices: list[bool], steps: int) -> list[list[int]]:
    import mlx.core as mx
    from mlx_lm.generate import StopSequences
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import greedy_sampler

    from mlxd.engine.speculative_batch import SpeculativeGenerator
    from mlxd.engine.speculative_core import SpecStats

    caches = []
    for prompt in prompts:
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        caches.append(cache)
    n = len(prompts)
    generator = SpeculativeGenerator(model, drafter, 4, Recorder(choices), SpecStats())
    generator.insert([[p[-1]] for p in prompts], max_tokens=[steps] * n, caches=caches,
                     all_tokens=[p[:-1] for p in prompts], samplers=[greedy_sampler] * n,
                     logits_processors=[[]] * n, stop_sequences=[StopSequences() for _ in prompts])
    tokens: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        for response in generator.next()[1]:
            tokens[response.uid].append(response.token)
    generator.close()
    return tokens


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_verifying_after_a_plain_step_keeps_a_short_row_s_tokens(family: str) -> None:
    from mlx_lm import load

    from mlxd.factory.zoo_build import build_family

    model, _ = load(str(build_family(family)))
    rng = random.Random(0)
    # 10 tokens (shorter than the window) beside 47 (longer).
    prompts = [[rng.randrange(500) for _ in range(n)] for n in (10, 47)]
    alone = [_decode(model, [p], NeverDrafts(), [False], 12)[0] for p in prompts]
    # Plain, verify, plain, verify, ...: every verify step follows a rotating one.
    batch = _decode(model, prompts, AlwaysDrafts(), [False, True], 12)
    assert batch == alone
