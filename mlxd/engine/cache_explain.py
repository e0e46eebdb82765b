"""Why a prompt re-prefilled: its prefix-cache decision explained, for
captured requests only. Pure over token ids: it needs of the cache nothing
but its entries' token keys (``PrefixCache.entry_keys``), and of the model
a ``decode`` to show the text where the prompt and the nearest entry part.

The reasons, in the order they are tried:
- ``no_entry``: the cache is empty (never filled, cleared, or a fresh load);
- ``evicted``: an entry seen at the previous lookup matched more of this
  prompt than anything cached now;
- ``prefix_hit``: the nearest entry covers the prompt's start to its own end
  (or the prompt's); the rest is new;
- ``template_change``: the prompt parts from the nearest entry inside the
  chat template's markup (a changed template, or different template kwargs);
- ``diverged``: it parts in the text itself, often a volatile header (a date,
  a request id, a billing line) early in the system prompt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from mlxd.engine.prompt import common_prefix

# Tokens shown either side of the point where the prompt and the entry part.
CONTEXT_TOKENS = 12
# A stretch of chat-template markup: <|im_start|>, <start_of_turn>, [INST], <think>...
MARKUP = re.compile(r"<\|[^|>]{1,40}\|>|<[/a-z_]{2,30}>|\[/?[A-Z_]{2,20}\]")


def _nearest(prompt: Sequence[int], entries: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(index, tokens shared) of the entry sharing the longest prefix with ``prompt``."""
    best, shared = -1, -1
    for index, key in enumerate(entries):
        n = common_prefix(prompt, key)
        if n > shared:
            best, shared = index, n
    return best, shared


class CacheExplainer:
    """One model's explainer: it remembers the entries of its previous
    lookup, to tell an eviction from a prompt that never matched."""

    def __init__(self) -> None:
        self._previous: list[tuple[int, ...]] = []

    def explain(
        self, prompt: Sequence[int], entries: Sequence[tuple[int, ...]], decode: Callable[[Sequence[int]], str],
        reused: int | None = None,
    ) -> dict[str, Any]:
        previous, self._previous = self._previous, list(entries)
        decision: dict[str, Any] = {"prompt_tokens": len(prompt), "entries": len(entries)}
        index, shared = _nearest(prompt, entries) if entries else (-1, 0)
        # The engine always prefills at least the prompt's last token.
        hit = min(shared, max(0, len(prompt) - 1)) if reused is None else reused
        decision["hit_tokens"] = max(0, hit)
        decision["missed_tokens"] = len(prompt) - decision["hit_tokens"]
        present = set(entries)
        gone = [key for key in previous if key not in present]
        _, shared_gone = _nearest(prompt, gone) if gone else (-1, 0)
        if not entries and shared_gone <= 0:
            return {**decision, "reason": "no_entry", "explanation": "The prefix cache held no entry for this model."}
        if shared_gone > max(shared, 0):
            return {
                **decision, "reason": "evicted", "evicted_shared_tokens": shared_gone,
                "explanation": f"An entry that shared {shared_gone} tokens with this prompt was evicted since the "
                               f"previous lookup; the nearest left shares {max(shared, 0)}.",
            }
        key = entries[index]
        decision["entry"] = {"rank": index, "tokens": len(key)}
        if shared >= len(key) or shared >= len(prompt):
            return {
                **decision, "reason": "prefix_hit",
                "explanation": f"Entry {index} (most recent first) covers the prompt's first {shared} tokens; "
                               f"{decision['missed_tokens']} prefilled.",
            }
        prompt_text = decode(prompt[max(0, shared - CONTEXT_TOKENS): shared + CONTEXT_TOKENS])
        entry_text = decode(key[max(0, shared - CONTEXT_TOKENS): shared + CONTEXT_TOKENS])
        decision.update(diverged_at=shared, prompt_text=prompt_text, entry_text=entry_text)
        if set(MARKUP.findall(prompt_text)) != set(MARKUP.findall(entry_text)):
            reason, why = "template_change", "inside the chat template's markup (a changed template or its kwargs)"
        else:
            reason, why = "diverged", "in the text (often a volatile header early in the system prompt)"
        return {
            **decision, "reason": reason,
            "explanation": f"The prompt parts from entry {index} at token {shared} of {len(key)}, {why}.",
        }
