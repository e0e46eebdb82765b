"""The gang's prefix-cache decisions (distributed/prefix_plan.py): which kept
entry a prompt starts from, what is copied, trimmed and dropped; the ranks
do exactly what these say, so they stay alike."""

from __future__ import annotations

import pytest

from mlxd.distributed.prefix_plan import GangPrefixPlan

SYSTEM = list(range(100, 140))


def _turn(plan: GangPrefixPlan, prompt: list[int], answer: list[int], nbytes: int = 10) -> tuple:
    reuse = plan.plan(prompt)
    dropped = plan.kept(reuse, prompt + answer, nbytes)
    return reuse, dropped


def test_a_first_prompt_starts_fresh_and_its_next_turn_extends_it_in_place():
    plan = GangPrefixPlan(max_bytes=1000)
    first, _ = _turn(plan, SYSTEM + [1, 2], [7, 8])
    assert first.source is None and first.shared == 0
    nxt = plan.plan(SYSTEM + [1, 2, 7, 8, 3, 4])
    assert (nxt.source, nxt.shared, nxt.copy, nxt.trim) == (first.keep_as, len(SYSTEM) + 4, False, 0)
    assert plan.entries == 0  # taken by the request; kept again under its own id when it ends


def test_two_conversations_over_one_system_prompt_each_keep_their_own():
    plan = GangPrefixPlan(max_bytes=1000)
    a1, _ = _turn(plan, SYSTEM + [1, 2], [7])
    b1, _ = _turn(plan, SYSTEM + [5, 6], [9])
    # B shared only the system prompt with A's entry: a trimmed copy, A's kept.
    assert (b1.source, b1.shared, b1.copy, b1.trim) == (a1.keep_as, len(SYSTEM), True, 3)
    a2 = plan.plan(SYSTEM + [1, 2, 7, 3])
    assert (a2.source, a2.shared, a2.copy) == (a1.keep_as, len(SYSTEM) + 3, False)


def test_the_last_prompt_token_is_always_run():
    plan = GangPrefixPlan(max_bytes=1000)
    first, _ = _turn(plan, [1, 2, 3], [4])
    again = plan.plan([1, 2, 3, 4])
    assert again.shared == 3 and again.source == first.keep_as and again.trim == 1 and again.copy


def test_a_cache_that_cannot_be_trimmed_serves_only_prompts_that_extend_it_whole():
    plan = GangPrefixPlan(max_bytes=1000, trimmable=False)
    a1, _ = _turn(plan, SYSTEM + [1, 2], [7])
    assert plan.plan(SYSTEM + [5, 6]).source is None
    a2 = plan.plan(SYSTEM + [1, 2, 7, 3])
    assert a2.source == a1.keep_as and not a2.copy and a2.trim == 0


def test_entries_beyond_the_byte_or_count_bound_go_least_recently_used_first():
    plan = GangPrefixPlan(max_bytes=25, max_entries=3)
    a, _ = _turn(plan, [1, 1, 1], [1])
    b, _ = _turn(plan, [2, 2, 2], [2])
    extended = plan.plan([1, 1, 1, 1, 5])  # A extended in place: B is now the oldest
    assert extended.source == a.keep_as
    assert plan.kept(extended, [1, 1, 1, 1, 5, 6], 10) == []
    _, dropped = _turn(plan, [3, 3, 3], [3])
    assert dropped == [b.keep_as]
    assert plan.nbytes <= 25
    many = GangPrefixPlan(max_bytes=10**6, max_entries=2)
    first, _ = _turn(many, [1, 2], [3])
    _turn(many, [4, 5], [6])
    _, dropped = _turn(many, [7, 8], [9])
    assert dropped == [first.keep_as] and many.entries == 2


def test_an_entry_whose_contents_are_unknown_is_dropped_on_every_rank():
    plan = GangPrefixPlan(max_bytes=1000)
    reuse = plan.plan([1, 2, 3])
    assert plan.forget(reuse) == [reuse.keep_as]
    assert plan.plan([1, 2, 3, 4]).source is None
    assert plan.kept(plan.plan([9, 9]), [], 0) != []  # nothing held: nothing kept
    _turn(plan, [5, 6], [7])
    assert len(plan.clear()) == 1 and plan.entries == 0


@pytest.mark.mlx
@pytest.mark.parametrize("family, trimmable", [("qwen3", True), ("gemma3_text", False), ("qwen3_next", False)])
def test_a_rank_reports_a_model_whose_cache_can_stop_trimming_as_untrimmable(family, trimmable):
    # What a rank tells the daemon at "ready", from the family's real model:
    # a fresh sliding-window cache trims (its window has not wrapped yet), so
    # asking the fresh cache let the plan cut gemma 3 entries it cannot cut.
    from mlx_lm import load

    from mlxd.distributed.rank import always_trimmable
    from zoo.zoo_support import zoo_model

    model, _ = load(str(zoo_model(family)))
    assert always_trimmable(model) is trimmable
    plan = GangPrefixPlan(max_bytes=1000, trimmable=always_trimmable(model))
    first, _ = _turn(plan, SYSTEM + [1, 2], [7, 8])
    other = plan.plan(SYSTEM + [5, 6])  # shares the system prompt only: needs a cut copy
    assert (other.source == first.keep_as) is trimmable


def test_saved_entries_adopted_by_a_new_gang_serve_as_before_and_keep_new_ids_apart():
    """What a manifest records (``saved``) and a new gang's plan takes back
    (``adopt``): the same prompts hit the same entries, least recently used
    still goes first, and a new request's id never reuses a restored one's."""
    old = GangPrefixPlan(max_bytes=1000)
    a, _ = _turn(old, SYSTEM + [1], [7])
    b, _ = _turn(old, SYSTEM + [2], [8])
    new = GangPrefixPlan(max_bytes=25)
    for entry_id, tokens, nbytes in old.saved():
        new.adopt(entry_id, tokens, nbytes)
    assert [e[0] for e in new.saved()] == [a.keep_as, b.keep_as]
    reuse = new.plan(SYSTEM + [1, 7, 5])
    assert reuse.source == a.keep_as and reuse.shared == len(SYSTEM) + 2
    assert reuse.keep_as > max(a.keep_as, b.keep_as)
    assert new.kept(reuse, SYSTEM + [1, 7, 5, 9], 10) == []
    assert new.kept(new.plan([3, 4, 5]), [3, 4, 5, 6], 10) == [b.keep_as]  # the least recent goes
