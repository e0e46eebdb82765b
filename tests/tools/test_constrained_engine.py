"""Structured output on real tiny models: what a client of response_format sees.

Random weights cannot write schema-valid JSON by chance; every valid answer
here is the grammar's doing. Whitespace is not flexible (see docs/tools.md),
and the schemas bound their strings and numbers, so a random model finishes.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from engine.engine_support import collect, greedy, run, text_of

from mlxd.engine.types import Constraint, SamplingParams
from mlxd.errors import BadRequest

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "verified": {"type": "boolean"},
            },
            "required": ["zip", "verified"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "kind", "address"],
    "additionalProperties": False,
}


def sampled(seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=seed)


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_json_schema_output_validates_for_nested_objects_arrays_enums(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    constraint = Constraint.json_schema(PERSON)
    for seed in range(3):
        chunks = run(collect(engine, greedy(max_tokens=120, constraint=constraint, sampling=sampled(seed))))
        text = text_of(chunks)
        assert chunks[-1].finish_reason == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
        # Properties come in the schema's order, as a client's model classes expect.
        assert list(json.loads(text))[:3] == ["name", "age", "kind"]


def test_json_object_gives_an_object(single):
    chunks = run(collect(single, greedy(max_tokens=200, constraint=Constraint.json_object(), sampling=sampled(1))))
    if chunks[-1].finish_reason == "stop":
        assert isinstance(json.loads(text_of(chunks)), dict)
    else:
        # Free keys and strings may run long on random weights; never a silent cut.
        assert chunks[-1].finish_reason == "length"
        assert text_of(chunks).startswith("{")


def test_without_the_constraint_the_same_model_writes_no_json(single):
    text = text_of(run(collect(single, greedy(max_tokens=40, sampling=sampled(0)))))
    with pytest.raises(ValueError):
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_max_tokens_under_a_constraint_ends_with_length(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    chunks = run(collect(engine, greedy(max_tokens=6, constraint=Constraint.json_schema(PERSON))))
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].completion_tokens == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(text_of(chunks))


def test_constrained_and_free_requests_share_a_batch(batched):
    free_alone = text_of(run(collect(batched, greedy("free-alone", max_tokens=24))))

    async def together():
        constrained = collect(
            batched, greedy("json", max_tokens=120, constraint=Constraint.json_schema(PERSON), sampling=sampled(2))
        )
        free = collect(batched, greedy("free", max_tokens=24))
        return await asyncio.gather(constrained, free)

    steps_before = batched.stats()["batched_steps"]
    json_chunks, free_chunks = run(together())
    jsonschema.validate(json.loads(text_of(json_chunks)), PERSON)
    assert json_chunks[-1].finish_reason == "stop"
    # The free row is token for token what it is alone.
    assert text_of(free_chunks) == free_alone
    # Both ran in one batch: fewer decode steps than the two answers' tokens.
    steps = batched.stats()["batched_steps"] - steps_before
    assert steps < json_chunks[-1].completion_tokens + free_chunks[-1].completion_tokens


@pytest.mark.parametrize("engine_name", ["single", "batched"])
def test_a_schema_that_cannot_compile_is_a_bad_request_naming_the_problem(engine_name, request):
    engine = request.getfixturevalue(engine_name)
    bad = Constraint.json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    with pytest.raises(BadRequest) as info:
        run(collect(engine, greedy(max_tokens=8, constraint=bad)))
    assert "missing" in info.value.message
    assert info.value.param == "response_format"
    # The engine is still fine afterwards.
    assert run(collect(engine, greedy(max_tokens=4)))[-1].finish_reason is not None


def test_an_unknown_schema_type_is_a_bad_request(single):
    with pytest.raises(BadRequest, match="bogus"):
        run(collect(single, greedy(max_tokens=8, constraint=Constraint.json_schema({"type": "bogus"}))))


def test_a_bad_pattern_is_a_bad_request_saying_what_is_wrong_with_it(single):
    # llguidance's error runs over several lines; the first alone was "regex parse error:".
    bad = Constraint.json_schema({"type": "string", "pattern": "([a-"})
    with pytest.raises(BadRequest, match=r"regex parse error: \(\[a- error: unclosed character class"):
        run(collect(single, greedy(max_tokens=8, constraint=bad)))


def test_a_bad_lark_grammar_is_a_bad_request(single):
    with pytest.raises(BadRequest, match="unknown name"):
        run(collect(single, greedy(max_tokens=8, constraint=Constraint.lark("start: nowhere\n"))))


def test_grammars_are_compiled_once_per_schema(single):
    constraint = Constraint.json_schema({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False})
    before = single.grammars.stats()
    for _ in range(3):
        chunks = run(collect(single, greedy(max_tokens=20, constraint=constraint)))
        assert json.loads(text_of(chunks)) in ({"ok": True}, {"ok": False})
    after = single.grammars.stats()
    assert after["compiled"] - before["compiled"] == 1
    assert after["hits"] - before["hits"] == 2


def test_the_grammar_cache_is_bounded(qwen_tiny):
    from mlx_lm import load

    from mlxd.grammar.compiler import GrammarCompiler

    _, tokenizer = load(str(qwen_tiny))
    compiler = GrammarCompiler(tokenizer, 2048, max_grammars=2)
    for n in range(4):
        compiler.matcher(Constraint.json_schema({"type": "integer", "maximum": n}))
    assert compiler.stats()["grammars"] == 2


def test_the_processor_masks_each_step_and_ends_with_eos_only(qwen_tiny):
    import mlx.core as mx
    from mlx_lm import load

    from mlxd.grammar.compiler import GrammarCompiler
    from mlxd.grammar.processor import GrammarProcessor

    _, tokenizer = load(str(qwen_tiny))
    compiler = GrammarCompiler(tokenizer, 2048)
    eos = compiler.eos_token_ids
    processor = GrammarProcessor(compiler.matcher(Constraint.json_schema({"enum": ["yes"]})), 2048, eos)
    prompt = tokenizer.encode("Answer:")
    logits = mx.zeros((1, 2048))
    written: list[int] = []
    for _ in range(10):
        masked = processor(mx.array(prompt + written), logits)
        allowed = [i for i, v in enumerate(masked[0].tolist()) if v != float("-inf")]
        assert allowed
        if allowed == eos:
            break
        written.append(allowed[0])
    assert tokenizer.decode(written) == '"yes"'
    assert processor.complete


def test_a_token_outside_the_grammar_ends_the_output(qwen_tiny):
    import mlx.core as mx
    from mlx_lm import load

    from mlxd.grammar.compiler import GrammarCompiler
    from mlxd.grammar.processor import GrammarProcessor

    _, tokenizer = load(str(qwen_tiny))
    compiler = GrammarCompiler(tokenizer, 2048)
    processor = GrammarProcessor(compiler.matcher(Constraint.json_schema({"type": "boolean"})), 2048, compiler.eos_token_ids)
    prompt = tokenizer.encode("Answer:")
    processor(mx.array(prompt), mx.zeros((1, 2048)))
    not_json = tokenizer.encode("hello")[0]
    masked = processor(mx.array([*prompt, not_json]), mx.zeros((1, 2048)))
    allowed = [i for i, v in enumerate(masked[0].tolist()) if v != float("-inf")]
    assert allowed == compiler.eos_token_ids
    assert processor.failed and not processor.complete


def test_leaving_a_large_grammar_logs_one_clipped_line_once_per_grammar(qwen_tiny, caplog):
    import logging

    import mlx.core as mx
    from mlx_lm import load

    from mlxd.grammar.compiler import GrammarCompiler
    from mlxd.grammar.processor import GrammarProcessor

    _, tokenizer = load(str(qwen_tiny))
    compiler = GrammarCompiler(tokenizer, 2048)
    # A client's schema of ~2 MB: it must not reach the log, let alone per request.
    schema = {"type": "object", "properties": {f"field_{i:06d}": {"type": "boolean", "description": "x" * 60}
                                               for i in range(2_000)}, "required": ["field_000000"]}
    constraint = Constraint.json_schema(schema)
    prompt = tokenizer.encode("Answer:")
    not_json = tokenizer.encode("hello")[0]
    with caplog.at_level(logging.WARNING, logger="mlxd.grammar"):
        for _ in range(3):  # three requests under the same grammar, each leaving it
            processor = GrammarProcessor(compiler.matcher(constraint), 2048, compiler.eos_token_ids,
                                         report=lambda why: compiler.report_failure(constraint, why))
            processor(mx.array(prompt), mx.zeros((1, 2048)))
            processor(mx.array([*prompt, not_json]), mx.zeros((1, 2048)))
            assert processor.failed
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "\n" not in warnings[0] and len(warnings[0]) <= 400, warnings[0][:500]
    assert "left its grammar" in warnings[0]
