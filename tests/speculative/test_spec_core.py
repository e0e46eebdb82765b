"""The pure decisions of speculative decoding: drafts, acceptance, rollback, figures."""

from __future__ import annotations

import random

import pytest

from mlxd.engine.speculative_core import NgramIndex, SpecStats, accept, next_draft_length, rollback


def test_prompt_lookup_drafts_what_followed_the_latest_longest_match() -> None:
    index = NgramIndex([5, 1, 2, 9, 7, 1, 2, 3, 4, 8, 1, 2])
    # "1 2" last occurred followed by 3 4 8 (the latest), not by 9 7.
    assert index.draft(3) == [3, 4, 8]
    index.append(3)
    # "1 2 3" is the longest suffix that occurred before.
    assert index.draft(2) == [4, 8]
    assert index.draft(0) == []
    # Near the end of the history a draft is shorter than asked.
    assert index.draft(10) == [4, 8, 1, 2, 3]
    assert NgramIndex([1, 2, 3]).draft(4) == []
    # A single token's last occurrence is no match (too often wrong) unless asked.
    assert NgramIndex([4, 6, 9, 4]).draft(2) == []
    assert NgramIndex([4, 6, 9, 4], min_n=1).draft(2) == [6, 9]


def test_whether_a_row_would_draft_now_or_after_the_token_on_its_way() -> None:
    # What a batch running one ahead asks before it commits the token it computed.
    index = NgramIndex([5, 1, 2, 9, 7, 1])
    assert not index.would_draft()  # "7 1" never occurred before
    assert index.would_draft(2)  # "7 1 2" neither, but "1 2" did
    assert not index.would_draft(4)
    assert index.tokens == [5, 1, 2, 9, 7, 1]  # asking keeps nothing
    for then, history in [(2, [5, 1, 2, 9, 7, 1, 2]), (4, [5, 1, 2, 9, 7, 1, 4])]:
        assert index.would_draft(then) == bool(NgramIndex(history).draft(1))


def test_a_row_whose_last_token_is_new_cannot_draft_whatever_comes_next() -> None:
    """What lets a batch running one ahead skip reading the token on its way
    back: no draft can follow it unless the last token occurred before."""
    assert not NgramIndex([5, 1, 2, 9, 7]).could_draft_next()  # 7 is new
    assert NgramIndex([5, 1, 2, 9, 7, 1]).could_draft_next()  # 1 occurred, followed by 2
    rng = random.Random(3)
    for _ in range(300):
        index = NgramIndex([rng.randrange(6) for _ in range(rng.randrange(1, 12))])
        if not index.could_draft_next():
            assert not any(index.would_draft(then) for then in range(6))


def test_a_row_drafts_less_after_misses_and_doubles_back_while_it_copies() -> None:
    assert next_draft_length(4, 4, 1, most=4) == 2
    assert next_draft_length(2, 2, 0, most=4) == 1
    assert next_draft_length(1, 1, 1, most=4) == 2
    assert next_draft_length(4, 4, 4, most=4) == 4
    # A miss halves it, a full step doubles it: a copying row is back at K soon.
    assert next_draft_length(8, 8, 1, most=8) == 4
    assert next_draft_length(2, 2, 2, most=8) == 4
    # A step without drafts (nothing matched, or a plain step) changes nothing.
    assert next_draft_length(3, 0, 0, most=4) == 3


def test_drafts_are_kept_while_they_equal_the_draws() -> None:
    assert accept([4, 5, 6], [4, 5, 6, 7]) == 3
    assert accept([4, 5, 6], [4, 9, 6, 7]) == 1
    assert accept([4, 5, 6], [1]) == 0
    assert accept([], [3]) == 0


def test_rollback_is_one_trim_for_all_rows_plus_each_rows_rest() -> None:
    plan = rollback(5, [2, 5, 1])
    assert (plan.trim, plan.roll) == (0, (3, 0, 4))
    plan = rollback(5, [2, 2])
    assert (plan.trim, plan.roll, plan.uniform) == (3, (0, 0), True)
    with pytest.raises(ValueError):
        rollback(2, [3])


def test_figures_count_per_sequence_steps() -> None:
    stats = SpecStats()
    assert stats.acceptance_rate is None and stats.accepted_per_step is None
    stats.add(4, 4)
    stats.add(4, 0)
    assert stats.acceptance_rate == 0.5
    assert stats.accepted_per_step == 3.0


def test_the_shadow_of_prompt_lookup_counts_what_its_drafts_would_have_kept_on_plain_steps():
    from mlxd.engine.speculative_drafters import PromptLookup

    lookup = PromptLookup(4)
    # The history ends in 1, 2, which came before with 3 4 5 9 after it.
    lookup.join([[1, 2, 3, 4, 5, 9, 1, 2]])
    for token in (3, 4, 7):  # two drafts kept, then a miss: that verify step's own token
        lookup.commit([[token]], [0])
    assert lookup.shadow_counts() == (3, 2)
    assert lookup.shadow_counts() == (0, 0)  # read once
    # A step that verified real drafts is no plain step: not counted, and
    # what was in hand before it no longer follows.
    lookup.commit([[1, 2]], [2])
    assert lookup.shadow_counts() == (0, 0)
    # Free after the verify step; then the draft after its latest 2, 3 (4 7 1 2), kept for three.
    for token in (3, 4, 7, 1):
        lookup.commit([[token]], [0])
    assert lookup.shadow_counts() == (4, 3)
