"""OpenAI's ``logit_bias`` on real tiny models, on the single path and in the
continuous batch: what a client that biases tokens sees.

The tiny qwen2's tokenizer has 2048 tokens; " the" is token 294 and the end
token ``<|im_end|>`` is 2."""

from __future__ import annotations

import json

import pytest
from engine.engine_support import collect, greedy, run, text_of
from batching.test_batch_engine import one_by_one, together, varied

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest

pytestmark = pytest.mark.mlx

THE = 294
EOS = 2


def tokens_spelling(engine, text: str) -> list[int]:
    """Every token id that decodes to ``text``, with or without a leading space."""
    _, tokenizer = engine.model.get()
    return [i for i in range(engine.vocab_size) if tokenizer.decode([i]).strip() == text.strip()]


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_bias_of_100_makes_greedy_decoding_write_that_token_at_every_step(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    plain = run(collect(engine, greedy(max_tokens=12)))
    assert "the" not in text_of(plain).split(), "the model says `the` anyway: the test proves nothing"
    biased = run(collect(engine, greedy(max_tokens=12, logit_bias={THE: 100.0})))
    assert text_of(biased).split() == ["the"] * 12
    assert (biased[-1].finish_reason, biased[-1].completion_tokens) == ("length", 12)


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_bias_of_minus_100_on_the_greedy_token_makes_the_model_write_another(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    first = text_of(run(collect(engine, greedy(max_tokens=1, ignore_eos=True))))
    banned = tokens_spelling(engine, first)
    assert banned
    plain = text_of(run(collect(engine, greedy(max_tokens=8, ignore_eos=True))))
    biased = text_of(run(collect(engine, greedy(
        max_tokens=8, ignore_eos=True, logit_bias={token: -100.0 for token in banned},
    ))))
    assert plain.startswith(first)
    assert biased != plain
    assert biased.split()[0] != first.strip()


def test_biased_requests_in_a_batch_give_the_single_paths_text_and_leave_their_neighbours_alone(batched, single):
    biases = [{THE: 6.0, 17: 4.0}, None, {EOS: -100.0, 100: 9.0, 1000: 9.0}, None]
    requests = [varied(i, max_tokens=30, logit_bias=bias) for i, bias in enumerate(biases)]
    alone = run(one_by_one(single, requests))
    crowd = run(together(batched, requests))
    assert [text_of(c) for c in crowd] == [text_of(c) for c in alone]
    unbiased = run(one_by_one(single, [varied(i, max_tokens=30) for i in range(4)]))
    for i, bias in enumerate(biases):
        if bias is None:
            assert text_of(crowd[i]) == text_of(unbiased[i])
        else:
            assert text_of(crowd[i]) != text_of(unbiased[i]), f"bias {bias} changed nothing: the test proves nothing"


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_bias_on_the_end_token_ends_the_answer_unless_ignore_eos(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    ended = run(collect(engine, greedy(max_tokens=20, logit_bias={EOS: 100.0})))
    assert (ended[-1].finish_reason, ended[-1].completion_tokens, text_of(ended)) == ("stop", 1, "")
    # ignore_eos wins over any bias: the end token stays impossible.
    forced = run(collect(engine, greedy(max_tokens=20, ignore_eos=True, logit_bias={EOS: 100.0})))
    assert (forced[-1].finish_reason, forced[-1].completion_tokens) == ("length", 20)


KIND = {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "bird"]}}, "required": ["kind"],
        "additionalProperties": False}


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_bias_picks_among_what_the_grammar_allows_and_never_leaves_it(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    _, tokenizer = engine.model.get()
    constraint = Constraint.json_schema(KIND)
    answers = {}
    for kind in ("dog", "bird"):
        # The first token of the value: allowed only once the grammar reaches
        # it, and +100 everywhere else (the grammar's mask must win there).
        first = tokenizer.encode(kind)[0]
        chunks = run(collect(engine, greedy(max_tokens=20, constraint=constraint, logit_bias={first: 100.0})))
        assert chunks[-1].finish_reason == "stop", text_of(chunks)
        answers[kind] = json.loads(text_of(chunks))
    assert answers == {"dog": {"kind": "dog"}, "bird": {"kind": "bird"}}


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_token_id_outside_the_vocabulary_is_a_bad_request_naming_logit_bias(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    for token in (engine.vocab_size, -1):
        with pytest.raises(BadRequest) as caught:
            run(collect(engine, greedy(max_tokens=4, logit_bias={token: 1.0})))
        assert caught.value.param == "logit_bias"
        assert str(token) in str(caught.value)
    # The last id is in the vocabulary, and the engine serves on.
    assert run(collect(engine, greedy(max_tokens=4, logit_bias={engine.vocab_size - 1: 1.0})))[-1].finish_reason
