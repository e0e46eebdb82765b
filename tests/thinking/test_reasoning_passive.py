"""A thinking model's reasoning is counted without a logits processor when
nothing shapes the logits (no budget, no grammar waiting for the answer).

As a processor it read each row's last token back inside every step, which
turned every batched step of a thinking model into one that waits, row by
row (the speculative batch ran at 0.59x of plain decoding with it on a tiny
qwen3, and plain batching at half its pace). The count the user sees in
``usage`` must not change: the passive phase is fed every token written and
counts them as the processor's calls did."""

from __future__ import annotations

from typing import Any

import pytest
from zoo.zoo_support import CHAT, zoo_model, zoo_spec

from mlxd.engine.reasoning_budget import ReasoningPhase, observe

START, END = (7,), (8, 9)

# Generated tokens, the reasoning opened by the prompt or by the model itself.
WRITTEN = {
    "closes, then answers": (True, [1, 2, 3, 8, 9, 4, 5, 6]),
    "still reasoning at the end": (True, [1, 2, 3, 4]),
    "ends right after the marker": (True, [1, 2, 8, 9]),
    "opens its own block": (False, [4, 7, 1, 2, 8, 9, 5]),
    "never reasons": (False, [4, 5, 6]),
}


def counted_as_processor(opens: bool, written: list[int]) -> int:
    import mlx.core as mx

    # The same phase as the batch called it before: as a logits processor.
    phase = ReasoningPhase(START, END, opens=opens)
    logits = mx.zeros((1, 16))
    history = [0, 0]  # the prompt
    # Called before each token is drawn: the last token drawn is never seen.
    for token in written:
        phase(mx.array(history), logits)
        history.append(token)
    return phase.reasoning_tokens(len(written))


@pytest.mark.parametrize("case", list(WRITTEN))
def test_a_passive_phase_counts_what_the_processor_counted(case):
    opens, written = WRITTEN[case]
    passive = ReasoningPhase(START, END, opens=opens)
    assert passive.passive
    for token in written:
        observe(passive, token)
    assert passive.reasoning_tokens(len(written)) == counted_as_processor(opens, written)


def test_a_budget_or_a_grammar_keeps_it_a_processor():
    assert not ReasoningPhase(START, END, opens=True, budget=4).passive
    assert not ReasoningPhase(START, END, opens=True, after=[lambda tokens, logits: logits]).passive


# Cut right after the model opened its block: the last token, shown to no
# processor call, is the start marker (the processor alone counted 0).
CUT_AS_IT_OPENS = {"cut as it opens its block": (False, [4, 5, 7])}


@pytest.mark.parametrize("case", [*WRITTEN, *CUT_AS_IT_OPENS])
def test_a_processor_told_the_tokens_too_counts_each_once(case):
    """A processor's calls show it every token but the last; the engine
    hands it each token as well, before or after the call that shows it."""
    import mlx.core as mx

    opens, written = {**WRITTEN, **CUT_AS_IT_OPENS}[case]
    for observed_first in (True, False):
        phase = ReasoningPhase(START, END, opens=opens, budget=100)
        history = [0, 0]
        for token in written:
            if observed_first and len(history) > 2:
                observe(phase, history[-1])
            phase(mx.array(history), mx.zeros((1, 16)))
            if not observed_first and len(history) > 2:
                observe(phase, history[-1])
            history.append(token)
        observe(phase, written[-1])
        passive = ReasoningPhase(START, END, opens=opens)
        for token in written:
            observe(passive, token)
        assert phase.reasoning_tokens(len(written)) == passive.reasoning_tokens(len(written))


@pytest.fixture(scope="module")
def qwen3():
    from mlx_lm import load

    from mlxd.engine.text_model import TextModel

    model, tokenizer = load(str(zoo_model("qwen3")))
    return TextModel("qwen3", model, tokenizer, 4096)


def prepared(text_model, **extra):
    from mlxd.engine.lifecycle import GenerationControl
    from mlxd.engine.types import GenerationRequest

    return text_model.prepare(GenerationRequest(request_id="r", max_tokens=8, messages=CHAT, **extra),
                              GenerationControl("r"))


def test_a_thinking_models_plain_request_has_no_logits_processor(qwen3):
    plain = prepared(qwen3)
    assert plain.reasoning is not None, "qwen3 marks its reasoning: its phase still counts it"
    assert plain.processors == []
    budgeted = prepared(qwen3, reasoning_budget=2)
    assert budgeted.processors == [budgeted.reasoning]


def test_a_reply_cut_right_after_the_models_own_think_counts_it_on_every_path():
    """qwen3 opens its reasoning itself; pushed to write ``<think>`` (a
    logit_bias) and cut by max_tokens right after it, the marker is its
    reasoning's first token on the single path, in mlx-lm's batch and in the
    speculative one alike, with a reasoning budget (the phase a processor)
    or without. The speculative batch never shows a processor a row's last
    token: counted by its calls alone, it reported 0 there."""
    import asyncio
    import itertools

    from engine.engine_support import collect, greedy, run

    from mlxd.engine.loader import load_text_engine
    from mlxd.engine.worker import MlxWorker
    from mlxd.registry.model import SpeculativeSpec

    think = 1024  # the zoo's qwen3 vocabulary: <think>, </think> next to it
    bias = {think: 8.0, think + 1: 4.0}
    worker = MlxWorker().start()

    async def counts() -> list[tuple[list[str], int | None]]:
        engines = [
            await load_text_engine(zoo_spec("qwen3"), worker),
            await load_text_engine(zoo_spec("qwen3", max_concurrency=4), worker),
            await load_text_engine(zoo_spec("qwen3", max_concurrency=4,
                                            speculative=SpeculativeSpec("prompt_lookup", 4, auto_off=False)), worker),
        ]
        try:
            probe = await collect(engines[0], greedy("probe", 12, logit_bias=bias, logprobs=0))
            written = [entry.token for chunk in probe for entry in chunk.logprobs or ()]
            assert "<think>" in written[1:], written
            cut = written.index("<think>", 1) + 1
            out = []
            # No budget (the phase only counts), and one far from spent (a processor).
            for budget, engine in itertools.product((None, 50), engines):
                # Beside a longer request: the batches decode more than one row.
                chunks, _ = await asyncio.gather(
                    collect(engine, greedy("cut", cut, logit_bias=bias, logprobs=0, reasoning_budget=budget)),
                    collect(engine, greedy("beside", 3 * cut, logit_bias=bias)))
                out.append(([e.token for c in chunks for e in c.logprobs or ()], chunks[-1].reasoning_tokens))
            return out
        finally:
            for engine in engines:
                await engine.close()

    try:
        results = run(counts())
    finally:
        run(worker.shutdown())
    for written, reasoning in results:
        assert written[-1] == "<think>" and "<think>" not in written[:-1], written
        assert reasoning == 1, results


class Recorded:
    """The tokens a processor is shown, which records what it reads back:
    in a batch computing ahead the last of them is still on its way, and
    reading it makes the batch wait for that step."""

    def __init__(self, tokens: list[int]) -> None:
        import mlx.core as mx

        self.array = mx.array(tokens)
        self.reads = 0

    def __getitem__(self, index: Any) -> Any:
        self.reads += 1
        return self.array[index]


class Eager(ReasoningPhase):
    """The phase as it was: every token read back as soon as a call shows it."""

    def _blind(self, unseen: int) -> bool:
        return False


def decode_with(phase: ReasoningPhase, steps: int) -> tuple[list[int], list[int]]:
    """As an engine computing one step ahead drives the phase: each call
    shows the token on its way, which is handed over (``observe``) once
    written, after the call. The model would reason forever (token 1); a
    forced token is the only one the logits leave. Returns what was written
    and the steps whose call read a token back."""
    import mlx.core as mx

    written: list[int] = []
    reading: list[int] = []
    for step in range(steps):
        shown = Recorded([0, 0, *written])
        logits = phase(shown, mx.zeros((1, 16)))
        if written:
            phase.observe(written[-1])
        if shown.reads:
            reading.append(step)
        allowed = [i for i, v in enumerate(logits[0].tolist()) if v != float("-inf")]
        written.append(allowed[0] if len(allowed) == 1 else 1)
    return written, reading


def test_a_budget_far_from_its_end_reads_no_token_back_and_ends_where_it_did():
    budget = 6
    written, reading = decode_with(ReasoningPhase(START, END, opens=True, budget=budget), 12)
    eager, _ = decode_with(Eager(START, END, opens=True, budget=budget), 12)
    # The end marker is forced after the same six tokens of reasoning.
    assert written == eager == [1] * budget + list(END) + [1] * (12 - budget - len(END))
    # Only the calls that decide whether the budget is spent, and those that
    # force the marker, read a token back: not the ones far from it.
    assert reading and min(reading) >= budget - 1, reading
    assert ReasoningPhase(START, END, opens=True, budget=budget).device_history == 0
