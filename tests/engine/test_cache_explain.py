"""Why a prompt re-prefilled, explained from the cache's entry keys alone."""

from __future__ import annotations

from mlxd.engine.cache_explain import CacheExplainer

WORDS = {1: "<|im_start|>", 2: "system", 3: "Today", 4: "is", 5: "Monday", 6: "Tuesday", 7: "<|im_end|>",
         8: "hello", 9: "<|start|>", 10: "there"}


def decode(tokens) -> str:
    return " ".join(WORDS[t] for t in tokens)


def test_an_empty_cache_is_no_entry():
    decision = CacheExplainer().explain([1, 2, 3], [], decode)
    assert decision["reason"] == "no_entry" and decision["hit_tokens"] == 0 and decision["missed_tokens"] == 3


def test_an_entry_that_covers_the_start_is_a_hit_and_the_rest_is_new():
    decision = CacheExplainer().explain([1, 2, 3, 4, 5, 8, 10], [(9,), (1, 2, 3, 4, 5)], decode)
    assert decision["reason"] == "prefix_hit" and decision["hit_tokens"] == 5 and decision["entry"]["rank"] == 1


def test_a_changed_word_is_shown_where_the_prompt_parts_from_the_entry():
    decision = CacheExplainer().explain([1, 2, 3, 4, 6, 7, 8], [(1, 2, 3, 4, 5, 7, 8, 10)], decode)
    assert decision["reason"] == "diverged" and decision["diverged_at"] == 4 and decision["hit_tokens"] == 4
    assert decision["prompt_text"].endswith("is Tuesday <|im_end|> hello")
    assert decision["entry_text"].endswith("is Monday <|im_end|> hello there")


def test_parting_inside_the_template_markup_is_a_template_change():
    decision = CacheExplainer().explain([9, 2, 3, 4, 5], [(1, 2, 3, 4, 5, 8)], decode)
    assert decision["reason"] == "template_change" and decision["diverged_at"] == 0


def test_an_entry_seen_before_and_gone_now_is_an_eviction():
    explainer = CacheExplainer()
    explainer.explain([8], [(1, 2, 3, 4, 5, 7)], decode)
    decision = explainer.explain([1, 2, 3, 4, 5, 7, 8], [(9, 10)], decode)
    assert decision["reason"] == "evicted" and decision["evicted_shared_tokens"] == 6
