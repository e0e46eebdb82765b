"""The reasoning phase of a generation, as one logits processor.

Three jobs, all needing to know whether the model is reasoning now:

- a budget: at most N tokens of reasoning, then the family's end marker
  (``</think>``) is forced and the model goes on to its answer, as
  Anthropic's ``thinking.budget_tokens`` asks;
- a grammar (a forced tool call, a JSON schema) shapes the answer, not the
  reasoning: while the model reasons, the processors given as ``after``
  are not called; they start at the first token after the end marker (a
  grammar processor's first call reads no token, so it starts there);
- the count of reasoning tokens for ``usage``, exact by token (an engine's
  chunks may carry several tokens, reasoning and answer in one).

mlx-lm's ``(tokens, logits) -> logits``, one per request on the single and
the batched path alike. It follows the tokens the model writes: inside
reasoning (opened by the prompt, or by the model writing the start marker)
it counts them; once the budget is spent it allows only the next token of
the end marker until the marker is written.

Without a budget or a grammar to hold, the phase only counts, and it is
not a logits processor (``passive``): the engine hands it each token it
writes (``observe``) instead. As a processor it read the last token back
(``.item()``) inside every step, which a batch then had to wait for: every
request to a thinking model made mlx-lm's batch and the speculative one
run their rows' processors one row at a time and gave up computing the
next step ahead (on this project's CPU, with a tiny qwen3 at 8 streams,
the speculative batch ran at 0.59x of plain decoding).

The engine hands a processor phase each token too: its calls show it every
token but, on the speculative batch, a row's last (that batch calls a
row's processors only to draw its next token), and a reply cut right after
the model wrote its start marker counted one reasoning token fewer there
than on the other paths. Each token is followed once, by whichever comes
first.
"""

from __future__ import annotations

from typing import Any

from mlxd.tools.reasoning import ReasoningFormat


class ReasoningPhase:
    def __init__(
        self, start: tuple[int, ...], end: tuple[int, ...], *, opens: bool, budget: int | None = None,
        after: list[Any] | None = None, force: tuple[int, ...] = (), hold: bool = True,
    ) -> None:
        """``hold``: the ``after`` processors wait for the reasoning to end;
        False: they run on every token, the reasoning inside their grammar
        (harmony's forced call, whose grammar has the analysis message), and
        a spent budget forces only what the grammar allows there."""
        self.budget = None if budget is None else max(0, budget)
        self._start = start
        self._end = end
        # What the budget forces: the end marker, or more (harmony's end of the
        # analysis message and the final channel's header).
        self._force = force or end
        self.inside = opens
        self.spent = 0
        self._after = list(after or ())
        self._hold = hold
        # The end marker's tokens written so far while forcing it.
        self._forced = 0
        self._calls = 0
        self._recent: list[int] = []
        # Generated tokens seen inside the reasoning (its markers included), and outside it.
        self._reasoned = 0
        self._answered = 0
        # Generated tokens followed so far, by a call or by ``observe``: each once.
        self._followed = 0
        self._written = 0

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        # The first call sees the prompt only; each later one, one new token
        # (the engine may have handed it over already: ``observe``). A call
        # that decides the same whatever those tokens are does not read them
        # back (``_blind``): the engine hands them over once written.
        read = self._to_read()
        if read:
            for token in tokens[-read:].tolist():
                self._see(int(token))
        self._calls += 1
        spent = self.inside and self.budget is not None and self.spent >= self.budget
        forcing = self._forced < len(self._force) and (self._forced or spent)
        # A grammar that is not held sees every token, forced ones too, or it
        # would fall out of step with the text.
        if not self._hold or (not self.inside and not forcing):
            for processor in self._after:
                logits = processor(tokens, logits)
        if forcing:
            target = self._force[self._forced]
            self._forced += 1
            return mx.where(mx.arange(logits.shape[-1]) == target, logits, mx.array(float("-inf"), dtype=logits.dtype))
        return logits

    def _to_read(self) -> int:
        """How many tokens the next call reads back: those it shows but has
        not followed, unless it decides the same without them (``_blind``)."""
        unseen = self._calls - self._followed
        return unseen if self._calls and unseen > 0 and not self._blind(unseen) else 0

    def _blind(self, unseen: int) -> bool:
        """Whether a call's logits are the same whatever the ``unseen``
        tokens it shows but has not followed are: no grammar waits on them,
        nothing is being forced, and even if every one of them were reasoning
        the budget would not be spent (an end marker among them only stops
        the count; a start marker starts it from 0). Far from its budget a
        phase then needs no token read back, which would make the batch
        wait for the step on its way each step (a budget is what agents'
        requests to thinking models carry: Claude Code's budget_tokens,
        Codex's effort)."""
        if self._after or self.budget is None or 0 < self._forced < len(self._force):
            return False
        return (self.spent if self.inside else 0) + unseen < self.budget

    @property
    def device_history(self) -> int | None:
        """``sampling.device_history`` for this processor, now: 0 while its
        next call reads nothing back (the tokens it would show are followed,
        or ``_blind``), so a batch may compute the step ahead; None when it
        must read them on the host."""
        return None if self._after or self._to_read() else 0

    @property
    def passive(self) -> bool:
        """Nothing to do to the logits: no budget, no grammar waiting for the
        answer. Such a phase is given the tokens (``observe``), not the logits."""
        return self.budget is None and not self._after

    def observe(self, token: int) -> None:
        """A token the model wrote, every one, the last included: a passive
        phase's only input. A processor's calls show it the same tokens, in
        the same order, but not always the last one (the speculative batch
        calls a row's processors only to draw a next token): a token no call
        has shown yet is followed here, one already shown is not again."""
        self._written += 1
        if self._written > self._followed:
            self._see(token)

    def reasoning_tokens(self, completion_tokens: int) -> int:
        """Of ``completion_tokens`` generated, how many were reasoning. (The
        last token reaches no processor call: still inside, it is reasoning.)"""
        if self.inside:
            return max(0, completion_tokens - self._answered)
        return min(self._reasoned, completion_tokens)

    def _see(self, token: int) -> None:
        self._followed += 1
        self._recent = (self._recent + [token])[-max(len(self._start), len(self._end), 1):]
        if self.inside:
            self._reasoned += 1
            if _ends_with(self._recent, self._end):
                self.inside = False
            else:
                self.spent += 1
        elif self._start and (not self._after or not self._hold) and _ends_with(self._recent, self._start):
            # (Under a held grammar the answer is the grammar's: no new reasoning.)
            self.inside = True
            self.spent = 0
            self._forced = 0
            self._reasoned += len(self._start)
            self._answered -= len(self._start) - 1
        else:
            self._answered += 1


def reasoning_phase(
    fmt: ReasoningFormat | None, *, opens: bool, budget: int | None, after: list[Any]
) -> ReasoningPhase | None:
    """The processor that follows a thinking model's reasoning (its count,
    its budget, the grammar that waits for it to end); None when the model
    has no end marker to follow (no reasoning format). Harmony's analysis
    channel is followed only for a budget: its answer is split from its
    channels whole (``mlxd.tools.harmony``). A grammar on harmony runs from
    the first token on (a forced call's grammar has the analysis message
    before the call); a spent budget then forces the analysis's ``<|end|>``
    alone, and the grammar goes on to the call."""
    if fmt is None or not fmt.end_ids or (fmt.harmony and budget is None):
        return None
    if fmt.harmony and after:
        return ReasoningPhase(fmt.start_ids, fmt.end_ids, opens=False, budget=budget, after=after, hold=False)
    return ReasoningPhase(fmt.start_ids, fmt.end_ids, opens=opens, budget=budget, after=after, force=fmt.force_ids)


def last_processors(phase: ReasoningPhase | None, grammar: list[Any]) -> list[Any]:
    """The processors that go last, so that none after them can revive a
    masked token: the phase where it shapes the logits (its budget; the
    grammar it holds until the reasoning ends), else the grammar alone (a
    passive phase holds none)."""
    return [phase] if phase is not None and not phase.passive else grammar


def observe(phase: ReasoningPhase | None, token: int) -> None:
    """``token``, written, to ``phase`` (passive or a processor)."""
    if phase is not None:
        phase.observe(token)


def _ends_with(tokens: list[int], marker: tuple[int, ...]) -> bool:
    return bool(marker) and tuple(tokens[-len(marker):]) == marker
