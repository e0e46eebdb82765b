"""A continuous batch that decodes speculatively, each sequence on its own.

It stands where mlx-lm's ``BatchGenerator`` stands in ``engine/batch.py``
(the same ``insert`` / ``next`` / ``remove`` / ``close``), for a model with
``speculative:`` in its entry. Each step:

1. the drafter proposes up to K tokens per sequence (prompt lookup: from the
   sequence's own prompt and output; a draft model: K greedy tokens of it);
2. one forward pass of the model over every row's block: its last emitted
   token and its drafts, right-padded to the longest block;
3. per row, position by position, the row's logits processors (penalties,
   logit_bias, the grammar: a drafted token it forbids is never drawn, so it
   is rejected) and its sampler draw the token; the row keeps its drafts while
   they equal the draws (``speculative_core.accept``), and emits the draws up
   to the first mismatch, an end token or its max_tokens;
4. the cache gives back, per row, what the row did not keep
   (``speculative_cache``), and the drafter learns what was emitted.

The row's processors are called once per emitted token, in order, with the
tokens so far, exactly as without speculation, so a stateful one (the grammar
matcher, the reasoning budget) sees the same calls. The governor
(``speculative_governor.Governor``) makes a step plain (no drafts) when
speculation does not pay for this mix of sequences; a plain step is the same
code with blocks of one token.

Rows of the engine's warm-up (``insert(warmups=)``) compile what a verify
step runs before users do: on a device that compiles kernels for the shapes
it meets (CUDA), the first two steps of each pair of batch size and block
width ran 2-5 times slower than the third (bench/verify_shapes.py), and the
governor would have timed them as speculation's cost. While a warm-up row is
in the batch every step speculates, each row's drafts padded to a width that
cycles from K + 1 down to 1 (a plain step), and nothing is counted: neither
the governor nor the figures status shows see warm-up steps.

Worker thread (MLX).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mlxd.engine import speculative_cache as caches
from mlxd.engine.batch_settle import evaluate_soon
from mlxd.engine.sampling import device_history
from mlxd.engine.speculative_core import SpecStats, accept, next_draft_length, rollback
from mlxd.engine.speculative_governor import Governor


@dataclass
class Response:
    """One emitted token, as ``engine/batch.py`` reads mlx-lm's."""

    uid: int
    token: int
    logprobs: Any
    finish_reason: str | None = None
    prompt_cache: list[Any] | None = None
    all_tokens: list[int] | None = None


@dataclass(eq=False)
class _Row:
    uid: int
    last: int  # the last emitted token: not in the cache yet
    tokens: list[int]  # the tokens in the cache
    max_tokens: int
    sampler: Any
    processors: list[Any]
    matcher: Any  # end tokens (mlx-lm's StopSequences matcher)
    made: int = 0
    greedy: bool = False
    drafts: list[int] = field(default_factory=list)
    # Drafts it asks for next step (speculative_core.next_draft_length).
    want: int = 1
    warmup: bool = False
    # The last tokens its processors read on the device (sampling.device_history,
    # as of this step); None when one of them reads the host, and the row
    # cannot be computed ahead.
    history: int | None = 0


class SpeculativeGenerator:
    def __init__(self, model: Any, drafter: Any, tokens: int, governor: Governor, stats: SpecStats) -> None:
        self.model = model
        self.drafter = drafter
        self.k = tokens
        self.governor = governor
        self.stats = stats
        self._rows: list[_Row] = []
        self._cache: list[Any] | None = None
        self._next_uid = 0
        # The next tokens of a plain step computed ahead (_plain_ahead), and
        # responses settled between steps, for the next call to hand out.
        self._ahead: tuple[Any, Any] | None = None
        self._queued: list[Response] = []
        # Steps run while warm-up rows were in the batch: what width the next one verifies.
        self._warm_steps = 0
        # The last step verified drafts: the next plain step, the first of a
        # run, pays for leaving speculation (_plain_ahead).
        self._verified = False

    # ------------------------------------------------ BatchGenerator's calls
    def insert(
        self, prompts: list[list[int]], *, max_tokens: list[int], caches: list[list[Any]],
        all_tokens: list[list[int]], samplers: list[Any], logits_processors: list[list[Any]],
        stop_sequences: list[Any], warmups: list[bool] | None = None,
    ) -> list[int]:
        """Sequences whose cache holds ``all_tokens`` and whose next input is
        ``prompts[i][-1]``: they join the batch at once. ``warmups[i]``: the
        sequence is the engine's warm-up (see the module's docstring)."""
        from mlx_lm.sample_utils import greedy_sampler

        if self._ahead is not None:
            self._queued += self._settle()
        rows = []
        for prompt, limit, before, sampler, processors, stops, warmup in zip(
            prompts, max_tokens, all_tokens, samplers, logits_processors, stop_sequences,
            warmups or [False] * len(prompts),
        ):
            rows.append(_Row(self._next_uid, prompt[-1], list(before), limit, sampler, list(processors or ()),
                             stops.matcher(), greedy=sampler is greedy_sampler, want=self.k, warmup=warmup))
            self._next_uid += 1
        self._cache = caches_extend(self._cache, caches)
        self.drafter.join([r.tokens + [r.last] for r in rows], caches)
        self._rows += rows
        self._verified = False
        self.governor.joined()
        return [r.uid for r in rows]

    def remove(self, uids: list[int], return_prompt_caches: bool = False) -> dict[int, tuple[list[Any], list[int]]]:
        gone = set(uids)
        kept = {}
        if return_prompt_caches and self._cache is not None:
            for i, row in enumerate(self._rows):
                if row.uid in gone:
                    kept[row.uid] = ([layer.extract(i) for layer in self._cache], list(row.tokens))
        self._filter([i for i, r in enumerate(self._rows) if r.uid not in gone])
        return kept

    def settle(self) -> None:
        """Rows joined or left: their rearranged caches are evaluated in a
        call of their own, not at the front of the next step (batch_settle.py)."""
        evaluate_soon(self._cache, self._ahead)
        self.drafter.settle()

    def close(self) -> None:
        self._rows = []
        self._cache = None
        self._ahead = None
        self._queued = []
        self.drafter.close()

    def next(self) -> tuple[None, list[Response]]:
        out, self._queued = self._queued, []
        if not self._rows:
            return None, out
        warming = any(r.warmup for r in self._rows)
        if warming:
            width = self.k + 1 - self._warm_steps % (self.k + 1)
            self._warm_steps += 1
            speculate = width > 1
        else:
            speculate = self.governor.choose(len(self._rows), sum(len(r.tokens) for r in self._rows))
        # A row whose processors read the host (a grammar, a reasoning
        # budget near its end) needs its last token there; penalties and bias
        # vectors read it on the device, with the tokens on their way;
        # samplers do too. A budget far from its end reads nothing: what a
        # row's processors need is asked again each step.
        for row in self._rows:
            if row.processors:
                row.history = _history(row.processors)
        ahead_able = all(r.history is not None for r in self._rows)
        # A step that speculates is timed from here: reading the step computed
        # ahead back (what asking the drafter needs, below, and what
        # verifying needs) waits for that step's forward, a plain step's time
        # that belongs to speculation; its tokens count with the step's.
        started = time.perf_counter()
        if speculate and not warming and ahead_able:
            # A step that finds no drafts is a plain one, and runs as one:
            # one ahead, not as a block of one position read back before the
            # next is queued (free chat with prompt lookup finds nothing in
            # most steps, and such verify steps cost 1.45 plain steps on the
            # CPU, 1.5 on an H200). Running one ahead, the tokens on their
            # way are read first: the drafter's answer depends on them. That
            # read-back is what asking costs (the next step's forward is built
            # while the accelerator waits), so the governor counts such a
            # step as speculation's, not as the plain baseline: counted as
            # plain, it made the baseline look slower than plain decoding,
            # and speculation that did not pay looked as if it did.
            if self._ahead is not None and not self.drafter.could_draft_next():
                # No row's last token occurred before, so no token on its way
                # can find a draft: a plain step, without the read-back that
                # asking costs (1.15-1.4 plain steps at one row on an H100).
                # At one row of free chat such read-backs were most of what
                # the governor's speculating steps cost. A probe that lands
                # here measures nothing and waits for the next.
                return None, out + self._plain_ahead(timed=True)
            known = self._ahead[0].tolist() if self._ahead is not None else None
            if not self.drafter.would_draft(known):
                return None, out + self._plain_ahead(known, started, speculating=True)
        if not speculate and ahead_able:
            return None, out + self._plain_ahead(timed=not warming)
        settled = 0
        if self._ahead is not None:
            # The step computed ahead is emitted first; the rows then carry on from it.
            settled = len(self._rows)
            out += self._settle()
            if not self._rows:
                return None, out
        rows = self._rows
        for row in rows:
            row.drafts = []
        if speculate:
            proposed = self.drafter.propose(max(width - 1 if r.warmup else r.want for r in rows))
            for row, drafts in zip(rows, proposed):
                want = row.want
                if row.warmup:
                    # Padded with the row's last token: verification keeps what matches, as for any draft.
                    want, drafts = width - 1, (drafts + [row.last] * width)[: width - 1]
                row.drafts = drafts[: max(0, min(want, row.max_tokens - row.made - 1))]
        drafted = [len(r.drafts) for r in rows]
        emitted, responses = self._verify(rows)
        self._commit(emitted, drafted)
        self._verified = not warming
        if not warming:
            # A step where no row had drafts was a plain one, whatever was
            # chosen, unless it left a run of steps computed ahead to speculate.
            self.governor.record(any(drafted) or settled > 0, settled + sum(len(e) for e in emitted),
                                 time.perf_counter() - started)
        self._retire(responses)
        return None, out + [r for per_row in responses for r in per_row]

    def _retire(self, responses: list[list[Response]]) -> None:
        """Rows whose last response finished leave the batch with their cache
        (which holds ``all_tokens``)."""
        finished = [i for i, r in enumerate(responses) if r and r[-1].finish_reason is not None]
        for i in finished:
            last = responses[i][-1]
            last.prompt_cache = [layer.extract(i) for layer in self._cache]
            last.all_tokens = list(self._rows[i].tokens)
        if finished:
            self._filter([i for i in range(len(self._rows)) if i not in set(finished)])

    # ------------------------------------------- plain steps, one ahead
    # While every step is plain and no row has logits processors, the
    # forward pass of the next step is queued before this step's tokens are
    # read back (as mlx-lm's BatchGenerator does), so the accelerator works
    # while Python hands the tokens out. Sampled rows draw there too, one
    # draw a token as on every other path, so a seeded row draws the same
    # tokens: left to the verify path, every step of a batch with one
    # sampled row was read back before the next was queued, 1.5 plain
    # steps' time on an H200 (see next()), whether speculation was on or
    # off. Between such steps each row's ``tokens`` holds all it emitted,
    # all of it in the cache, and ``self._ahead`` its next token, computed
    # or on its way, not emitted and not in the cache. Any other step, a row joining and ``close`` first
    # emit that token (``_settle``), which restores the usual state: ``last``
    # emitted, not in the cache.
    def _forward_ahead(self, inputs: Any) -> tuple[Any, Any]:
        import mlx.core as mx

        logits = self.model(inputs[:, None], cache=self._cache)[:, -1, :]
        if any(r.processors for r in self._rows):
            logits = self._processed(logits, inputs)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self._pick(logprobs), logprobs

    def _processed(self, logits: Any, inputs: Any) -> Any:
        """Each row's processors on its logits, lazily: they read the row's
        last ``history`` tokens in the cache and this step's input, which may
        still be on its way (a token computed ahead), as an array. They see
        what ``_draw`` shows them, the tail they read of it."""
        import mlx.core as mx

        out = []
        for i, row in enumerate(self._rows):
            step = logits[i : i + 1]
            if row.processors:
                tail = row.tokens[-row.history :] if row.history else []
                seen = mx.concatenate([mx.array(tail, dtype=inputs.dtype), inputs[i : i + 1]])
                for processor in row.processors:
                    step = processor(seen, step)
            out.append(step)
        return mx.concatenate(out, axis=0)

    def _pick(self, logprobs: Any) -> Any:
        """Every row's next token: one call for the whole batch when it
        shares one sampler (greedy rows all share mlx-lm's; as its batch
        does), else each row's own sampler on its row."""
        import mlx.core as mx

        rows = self._rows
        if all(r.sampler is rows[0].sampler for r in rows):
            return rows[0].sampler(logprobs).reshape(-1)
        return mx.concatenate([r.sampler(logprobs[i : i + 1]).reshape(-1) for i, r in enumerate(rows)])

    def _plain_ahead(self, known: list[int] | None = None, started: float | None = None,
                     timed: bool = True, speculating: bool = False) -> list[Response]:
        """``known``: the tokens computed ahead, already read back; ``timed``:
        the governor times the step (not a warm-up's); ``speculating``: as a
        step of speculation's (one that asked the drafter), not of the plain
        baseline."""
        import mlx.core as mx

        started = time.perf_counter() if started is None else started
        rows = self._rows
        # The first step of a run of plain ones (after a verify step or a
        # join) also pays for what came before it: on this project's CPU it
        # took 1.7 plain steps' time, and timed as plain decoding it made the
        # baseline slow and speculation look twice as fast as it was. After a
        # verify step that is what leaving speculation costs, so it is timed
        # as speculation's: left out (and the wait for the step computed
        # ahead with it, in next()), free chat with prompt lookup on an H100
        # measured 1.51x in a run that gained 0.90x. After a join it is not
        # timed at all.
        first_of_run = self._ahead is None
        left_verify, self._verified = first_of_run and self._verified, False
        if first_of_run:
            self._ahead = self._forward_ahead(mx.array([r.last for r in rows]))
            for row in rows:
                row.tokens.append(row.last)
        tokens, logprobs = self._ahead
        self._ahead = self._forward_ahead(tokens)
        mx.async_eval(*self._ahead)
        responses = self._emit_ahead(tokens.tolist() if known is None else known, logprobs, in_cache=True)
        if timed and (left_verify or not first_of_run):
            self.governor.record(speculating or left_verify, len(rows), time.perf_counter() - started,
                                 leaving=left_verify)
        return responses

    def _settle(self) -> list[Response]:
        tokens, logprobs = self._ahead
        self._ahead = None
        return self._emit_ahead(tokens.tolist(), logprobs, in_cache=False)

    def _emit_ahead(self, tokens: list[int], logprobs: Any, *, in_cache: bool) -> list[Response]:
        responses = []
        for i, (row, token) in enumerate(zip(self._rows, tokens)):
            responses.append(self._emit(row, [(token, logprobs[i])])[1])
            if in_cache:
                row.tokens.append(token)
            row.last = token
        self._commit([[t] for t in tokens], [0] * len(tokens))
        self._retire(responses)
        return [r for per_row in responses for r in per_row]

    def _commit(self, emitted: list[list[int]], drafted: list[int]) -> None:
        """The drafter learns what each row emitted; the governor, what its
        drafts would have kept on plain steps, where it can tell."""
        self.drafter.commit(emitted, drafted)
        counts = self.drafter.shadow_counts()
        if counts and counts[0] and not any(r.warmup for r in self._rows):
            self.governor.shadow(*counts)

    # ------------------------------------------------------------ the step
    def _verify(self, rows: list[_Row]) -> tuple[list[list[int]], list[list[Response]]]:
        import mlx.core as mx

        width = 1 + max(len(r.drafts) for r in rows)
        block = mx.array([[r.last, *r.drafts] + [r.last] * (width - 1 - len(r.drafts)) for r in rows])
        cache = self._cache
        hybrid = caches.has_state_layers(cache)
        saved = caches.snapshot(cache) if hybrid and width > 1 else None
        caches.before_block(cache, width)
        logits = self.model(block, cache=cache)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        fast = [r.greedy and not r.processors for r in rows]
        picks = mx.argmax(logprobs, axis=-1) if any(fast) else None
        if picks is not None:
            mx.eval(picks)
            picked = picks.tolist()
        emitted: list[list[int]] = []
        responses: list[list[Response]] = []
        for i, row in enumerate(rows):
            if fast[i]:
                draws = picked[i][: len(row.drafts) + 1]
                take = accept(row.drafts, draws) + 1
                out = [(t, logprobs[i, j]) for j, t in enumerate(draws[:take])]
            else:
                out = self._draw(row, logits[i])
            tokens, per = self._emit(row, out)
            emitted.append(tokens)
            responses.append(per)
            if row.drafts and not row.warmup:
                # Every emitted token but the last was a kept draft.
                self.stats.add(len(row.drafts), len(tokens) - 1)
                row.want = next_draft_length(row.want, len(row.drafts), len(tokens) - 1, self.k)
        kept = [len(t) for t in emitted]
        if saved is not None and (min(kept) < width):
            caches.replay(self.model, cache, saved, block, kept)
        else:
            caches.roll_back(cache, rollback(width, kept))
        for row, tokens in zip(rows, emitted):
            row.tokens.append(row.last)
            row.tokens += tokens[:-1]
            row.last = tokens[-1]
        return emitted, responses

    def _draw(self, row: _Row, logits: Any) -> list[tuple[int, Any]]:
        """The row's processors and sampler, one position at a time, while
        its drafts are drawn again."""
        import mlx.core as mx

        out: list[tuple[int, Any]] = []
        context = [*row.tokens, row.last]
        for j in range(len(row.drafts) + 1):
            step = logits[j : j + 1]
            if row.processors:
                seen = mx.array(context)
                for processor in row.processors:
                    step = processor(seen, step)
            lp = step - mx.logsumexp(step, axis=-1, keepdims=True)
            token = int(row.sampler(lp).item())
            out.append((token, lp[0]))
            if j == len(row.drafts) or token != row.drafts[j]:
                break
            context.append(token)
        return out

    def _emit(self, row: _Row, drawn: list[tuple[int, Any]]) -> tuple[list[int], list[Response]]:
        """The drawn tokens up to an end token or max_tokens."""
        tokens: list[int] = []
        responses: list[Response] = []
        for token, lp in drawn:
            row.made += 1
            tokens.append(token)
            reason = None
            if row.made >= row.max_tokens:
                reason = "length"
            if row.matcher.advance(token):
                reason = "stop"
            responses.append(Response(row.uid, token, lp, reason))
            if reason is not None:
                break
        return tokens, responses

    def _filter(self, keep: list[int]) -> None:
        import mlx.core as mx

        self._rows = [self._rows[i] for i in keep]
        self.drafter.filter(keep)
        if self._ahead is not None:
            chosen = mx.array(keep)
            self._ahead = (self._ahead[0][chosen], self._ahead[1][chosen]) if keep else None
        if not keep:
            self._cache = None
        elif self._cache is not None:
            for layer in self._cache:
                layer.filter(keep)


def _history(processors: Any) -> int | None:
    """The most tokens a row's processors read back on the device (0 for
    none); None where one reads the host."""
    reads = [device_history(p) for p in processors]
    return None if None in reads else max(reads, default=0)


def caches_extend(batch: list[Any] | None, more: list[list[Any]]) -> list[Any]:
    return caches.extend(batch, caches.merge(more))
