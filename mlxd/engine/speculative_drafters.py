"""Who drafts the tokens a speculative batch verifies, one row per sequence.

Both keep one entry per row of the batch, in the batch's order:
``join`` (rows arrive with the tokens in their cache plus their next
input), ``propose(k)`` (drafts per row), ``commit`` (what each row emitted
and how many drafts it had), ``shadow_counts`` (what drafts would have kept
on the plain steps since it was last asked, or None where that costs a
forward), ``filter`` (rows that stay), ``close``.

- ``PromptLookup``: n-gram drafts from the row's own prompt and output
  (``speculative_core.NgramIndex``); no weights.
- ``DraftModel``: a small model of the same tokenizer, batched like the
  target, drafting K greedy tokens a step. Its own cache lags the target's
  by the row's ``pending`` tokens (the target's tokens it has not seen: one
  after a rejection, two when the whole block was kept, more after plain
  steps), which the next draft feeds first, right-padded. It starts from the
  last ``DRAFT_CONTEXT`` tokens of the prompt, not all of it, prefilled by
  the first draft the row takes part in, not when it joins: that draft is a
  step the governor times, so the prefill is counted as speculation's cost
  (uncounted, SmolLM2 as its own draft at 4 streams on a CPU read 1.45x
  and stayed on while it ran at 0.63x of plain; counted, it reads 0.65x and
  goes off), and while speculation is off it is never paid. A draft whose
  cache has sliding-window or state layers (Gemma 3's, Qwen3.5's small
  models) cannot give back its one-token steps: a rotated window has
  overwritten its oldest positions, a state has absorbed the drafts. Those
  layers are saved before the one-token steps and put back after the
  verification, the full-attention ones trimmed by all the drafts, and
  every token the row emitted is pending: the next draft replays the kept
  drafts in its first block, through the layers' block update.

Worker thread (MLX, for the draft model).
"""

from __future__ import annotations

from typing import Any

from mlxd.engine import speculative_cache as caches
from mlxd.engine.batch_settle import evaluate_soon
from mlxd.engine.speculative_core import NgramIndex, ShadowDraft, rollback

# Prompt tokens a draft model prefills when a sequence joins: its last ones
# only. The draft's prefill runs on the worker in one go, and a coding agent's
# prompt served from the target's prefix cache would otherwise make the
# draft prefill all of it before the first token (minutes on a CPU); what it
# drafts only decides the speed, verification keeps the output exact.
DRAFT_CONTEXT = 512


class PromptLookup:
    def __init__(self, k: int = 4) -> None:
        self._rows: list[NgramIndex] = []
        # What each row would have kept on its plain steps (``shadow_counts``).
        self._shadows: list[ShadowDraft] = []
        self._k = k
        self._seen = self._kept = 0

    def join(self, histories: list[list[int]], _caches: Any = None) -> None:
        for history in histories:
            index = NgramIndex(history)
            self._rows.append(index)
            self._shadows.append(ShadowDraft(self._k, index))

    def propose(self, k: int) -> list[list[int]]:
        return [index.draft(k) for index in self._rows]

    def would_draft(self, then: list[int] | None = None) -> bool:
        """Whether some row would draft now, or once it has emitted
        ``then[i]`` too (a batch running one ahead asks before it commits
        them); drafting nothing, a step is plain and may run one ahead."""
        if then is None:
            return any(index.would_draft() for index in self._rows)
        return any(index.would_draft(token) for index, token in zip(self._rows, then))

    def could_draft_next(self) -> bool:
        """Whether some row could draft once the token on its way is in,
        whatever that token is: where none could, a batch running one ahead
        need not read that token back to ask (``NgramIndex.could_draft_next``)."""
        return any(index.could_draft_next() for index in self._rows)

    def commit(self, emitted: list[list[int]], drafted: list[int]) -> None:
        plain = not any(drafted)
        for index, shadow, tokens in zip(self._rows, self._shadows, emitted):
            if not plain:
                shadow.forget()
                index.extend(tokens)
                continue
            for token in tokens:
                self._kept += shadow.step(index, token)
            self._seen += len(tokens)

    def shadow_counts(self) -> tuple[int, int]:
        """Tokens of plain steps since the last call, and how many of them
        drafts would have kept: what the governor weighs before it spends a
        verify step on finding out (``Governor.shadow``)."""
        counts, self._seen, self._kept = (self._seen, self._kept), 0, 0
        return counts

    def filter(self, keep: list[int]) -> None:
        self._rows = [self._rows[i] for i in keep]
        self._shadows = [self._shadows[i] for i in keep]

    def settle(self) -> None:
        """Nothing lazy to evaluate: the n-gram index lives on the host."""

    def close(self) -> None:
        self._rows = []
        self._shadows = []


class DraftModel:
    def __init__(self, model: Any, prefill_chunk: int = 512, context: int = DRAFT_CONTEXT) -> None:
        self.model = model
        self._chunk = max(1, prefill_chunk)
        self._context = max(0, context)
        self._cache: list[Any] | None = None
        # Per row, the target's tokens the draft has not seen. Rows from
        # ``_primed`` on joined since the last draft and have no draft cache
        # yet: theirs is the whole history. They are always the batch's last
        # rows (rows join at the end), so the cache's rows are the first ones.
        self._pending: list[list[int]] = []
        self._primed = 0
        self._proposed = 0
        # The sliding-window and state layers as they were before the last
        # draft's one-token steps (None: a plain KV draft, rolled back instead).
        self._saved: list[Any] | None = None

    def join(self, histories: list[list[int]], _caches: Any = None) -> None:
        self._pending += [list(history) for history in histories]

    def _prime(self) -> None:
        """The joined rows' draft caches, from the last tokens of each history."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        fresh = []
        for i in range(self._primed, len(self._pending)):
            history = self._pending[i]
            cache = make_prompt_cache(self.model)
            prompt = mx.array(history[max(0, len(history) - 1 - self._context) : -1])
            for start in range(0, prompt.size, self._chunk):
                self.model(prompt[start : start + self._chunk][None], cache=cache)
                mx.eval([c.state for c in cache])
            fresh.append(cache)
            self._pending[i] = [history[-1]]
        self._cache = caches.extend(self._cache, caches.merge(fresh))
        self._primed = len(self._pending)

    def would_draft(self, then: list[int] | None = None) -> bool:
        """A draft model drafts for every row, every step."""
        return bool(self._pending)

    def could_draft_next(self) -> bool:
        return bool(self._pending)

    def shadow_counts(self) -> None:
        """What its drafts would have kept is not known without running it."""
        return None

    def propose(self, k: int) -> list[list[int]]:
        import mlx.core as mx

        if self._primed < len(self._pending):
            self._prime()
        cache = self._cache
        assert cache is not None
        lengths = [len(p) for p in self._pending]
        longest = max(lengths)
        padding = [longest - n for n in lengths]
        block = mx.array([p + [p[-1]] * (longest - len(p)) for p in self._pending])
        if any(padding):
            for layer in cache:
                layer.prepare(lengths=lengths, right_padding=padding)
        caches.before_block(cache, longest)
        logits = self.model(block, cache=cache)
        if any(padding):
            for layer in cache:
                layer.finalize()
        ends = mx.array([n - 1 for n in lengths])[:, None, None]
        token = mx.argmax(mx.take_along_axis(logits, ends, axis=1)[:, 0, :], axis=-1)
        drafts = [token]
        self._saved = caches.save_unrollable(cache) if k > 1 else None
        for _ in range(k - 1):
            token = mx.argmax(self.model(token[:, None], cache=cache)[:, -1, :], axis=-1)
            drafts.append(token)
        mx.eval(drafts)
        self._proposed = k
        return mx.stack(drafts, axis=1).tolist()

    def commit(self, emitted: list[list[int]], drafted: list[int]) -> None:
        k = self._proposed
        self._proposed = 0
        if not k:
            # A plain step: the draft has seen none of it yet.
            for pending, tokens in zip(self._pending, emitted):
                pending += tokens
            return
        assert self._cache is not None
        if self._saved is not None:
            # Back to the pending tokens alone; all a row emitted is pending.
            caches.put_back(self._cache, self._saved, k - 1)
            self._saved = None
            self._pending = [list(tokens) for tokens in emitted]
            return
        # The cache holds each row's pending tokens and k - 1 drafts; a row
        # keeps the drafts it accepted, and what it emitted after them is pending.
        kept = []
        for i, tokens in enumerate(emitted):
            accepted = min(len(tokens) - 1, drafted[i], k - 1)
            kept.append(accepted)
            self._pending[i] = tokens[accepted:]
        caches.roll_back(self._cache, rollback(k - 1, kept))

    def filter(self, keep: list[int]) -> None:
        self._pending = [self._pending[i] for i in keep]
        cached = [i for i in keep if i < self._primed]
        self._primed = len(cached)
        if not cached:
            self._cache = None
        elif self._cache is not None:
            for layer in self._cache:
                layer.filter(cached)

    def settle(self) -> None:
        """The draft cache, rearranged as rows joined or left, evaluated
        before the next draft step (batch_settle.py)."""
        evaluate_soon(self._cache)

    def close(self) -> None:
        self._cache = None
        self._pending = []
        self._primed = 0
        self._saved = None
