"""A thinking model's reasoning is counted without a logits processor when
nothing shapes the logits (no budget, no grammar waiting for the answer).

As a processor it read each row's last token back inside every step, which
turned every batched step of a thinking model into one that waits, row by
row (the speculative batch ran at 0.59x of plain decoding with it on a tiny
qwen3, and plain batching at half its pace). The count the user sees in
``usage`` must not change: the passive phase is fed every token written and
counts them as the processor's calls did."""

from __future__ import annotations

import pytest
from zoo.zoo_support import CHAT, zoo_model

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
    # A processor's count is its calls': observe leaves it alone.
    phase = ReasoningPhase(START, END, opens=True, budget=4)
    observe(phase, 1)
    assert phase.spent == 0


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
