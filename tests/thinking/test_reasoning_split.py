"""Reasoning split from the answer: the think markers and harmony's channels
as real tokenizers decode them, token by token; which format a model gets;
reasoning tokens counted; the remote wire carrying it both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zoo.zoo_support import zoo_model

from mlxd.api.events import ChoiceEvents, Finish, ReasoningDelta, TextDelta, ToolCallDelta
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.remote.answer import StreamReader, whole_answer
from mlxd.remote.wire import request_body
from mlxd.tools import formats, reasoning
from mlxd.tools.splitter import AnswerSplitter, ReasoningText, TextDelta as SplitText, ToolCallStart, split_answer

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(zoo_model("qwen3"))


@pytest.fixture(scope="module")
def harmony():
    """gpt-oss's tokenizer, harmony's special tokens in it (no openai-harmony, no network)."""
    from mlx_lm.tokenizer_utils import load

    return load(zoo_model("gpt_oss"))


def decoded_pieces(tokenizer, text: str) -> list[str]:
    """``text`` as the engine streams it: encoded, then detokenized one token at a time."""
    detokenizer = tokenizer.detokenizer
    pieces = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        detokenizer.add_token(token)
        pieces.append(detokenizer.last_segment)
    detokenizer.finalize()
    pieces.append(detokenizer.last_segment)
    return [p for p in pieces if p]


def run(splitter: AnswerSplitter, pieces: list[str]) -> list:
    events = []
    for piece in pieces:
        events += splitter.feed(piece)
    return events + splitter.finish()


def joined(events, kind) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def test_mlx_lms_detection_gives_a_qwen3_tokenizer_the_think_markers(qwen3_tokenizer):
    fmt = reasoning.resolve(qwen3_tokenizer)
    assert (fmt.name, fmt.start, fmt.end) == ("think", "<think>", "</think>")
    assert fmt.end_ids == tuple(qwen3_tokenizer.think_end_tokens)
    assert reasoning.resolve(qwen3_tokenizer, "none") is None
    assert reasoning.resolve_from_files(zoo_model("qwen3")) == "think"


def test_a_tokenizer_without_markers_has_no_reasoning_format():
    from mlx_lm.tokenizer_utils import load
    from support.daemon import tiny_model

    tokenizer = load(tiny_model("qwen"))
    assert reasoning.resolve(tokenizer) is None
    assert reasoning.resolve_from_files(tiny_model("qwen")) is None
    # The registry can name a pair the vocabulary does not hold as tokens: it is matched as text.
    assert reasoning.resolve(tokenizer, "qwen3").start == "<think>"


def test_reasoning_then_a_tool_call_on_a_real_token_stream(qwen3_tokenizer):
    text = "<think>\nThe user wants the weather.\n</think>\n\n" + WEATHER_CALL
    pieces = decoded_pieces(qwen3_tokenizer, text)
    assert "</think>" in pieces  # one token, as the model writes it
    splitter = AnswerSplitter(formats.resolve(qwen3_tokenizer), None, reasoning.resolve(qwen3_tokenizer))
    events = run(splitter, pieces)
    assert joined(events, ReasoningText) == "\nThe user wants the weather.\n"
    assert joined(events, SplitText) == "\n\n"  # the blank lines after the marker, as mlx_lm.server leaves them
    assert [c.name for c in splitter.calls] == ["get_weather"]
    assert json.loads(splitter.calls[0].arguments) == {"city": "Paris"}


def test_a_call_written_inside_the_reasoning_is_reasoning_not_a_call(qwen3_tokenizer):
    answer = split_answer(formats.resolve(qwen3_tokenizer), f"<think>I could write {WEATHER_CALL}</think>Sunny.",
                          reasoning=reasoning.resolve(qwen3_tokenizer))
    assert (answer.content, answer.tool_calls) == ("Sunny.", [])
    assert "get_weather" in answer.reasoning


def test_a_prompt_that_opened_the_block_starts_the_answer_as_reasoning(qwen3_tokenizer):
    fmt = reasoning.resolve(qwen3_tokenizer)
    prompt = qwen3_tokenizer.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    closed = qwen3_tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    assert fmt.opens_in(prompt) and not fmt.opens_in(closed)
    pieces = decoded_pieces(qwen3_tokenizer, "Let me look.</think>\n\nIt is sunny.")
    events = run(AnswerSplitter(None, None, fmt, opens=True), pieces)
    assert (joined(events, ReasoningText), joined(events, SplitText)) == ("Let me look.", "\n\nIt is sunny.")
    # Not opened: the same text is all answer (no marker was ever opened).
    events = run(AnswerSplitter(None, None, fmt), decoded_pieces(qwen3_tokenizer, "It is sunny."))
    assert joined(events, SplitText) == "It is sunny."


def test_a_marker_split_across_deltas_is_still_a_marker():
    fmt = reasoning.ReasoningFormat("think", "<think>", "</think>")
    events = run(AnswerSplitter(None, None, fmt), ["<th", "ink>ab", "c</th", "in", "k>de", "f"])
    assert (joined(events, ReasoningText), joined(events, SplitText)) == ("abc", "def")
    # Text that only looked like the start of a marker is given back.
    events = run(AnswerSplitter(None, None, fmt), ["a <thi", "s is text"])
    assert joined(events, SplitText) == "a <this is text"


def test_harmony_channels_from_gpt_oss_tokens_offline(harmony):
    fmt = reasoning.resolve(harmony)
    assert fmt.harmony and formats.resolve(harmony).name == "harmony"
    text = ('<|channel|>analysis<|message|>They want the weather.<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')
    splitter = AnswerSplitter(formats.resolve(harmony), None, fmt)
    events = run(splitter, decoded_pieces(harmony, text))
    assert joined(events, ReasoningText) == "They want the weather."
    assert joined(events, SplitText) == ""
    assert [(c.name, json.loads(c.arguments)) for c in splitter.calls] == [("get_weather", {"city": "Paris"})]
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    answer = split_answer(None, final, reasoning=fmt)
    assert (answer.reasoning, answer.content) == ("Easy.", "It is sunny.")


def test_harmony_without_channels_is_text_and_a_bad_call_is_dropped():
    fmt = reasoning.ReasoningFormat("harmony")
    assert split_answer(None, "plain words", reasoning=fmt).content == "plain words"
    answer = split_answer(None, "<|channel|>commentary to=functions.f<|message|>not json", reasoning=fmt)
    assert (answer.tool_calls, answer.dropped) == ([], 1)


def chunk(text: str, n: int, finish: str | None = None, **kw) -> GenerationChunk:
    return GenerationChunk(text=text, finish_reason=finish, prompt_tokens=10, completion_tokens=n, **kw)


def test_reasoning_tokens_are_counted_from_the_chunks_they_came_in():
    events = ChoiceEvents(None, None, reasoning.ReasoningFormat("think", "<think>", "</think>"))
    out = []
    stream = [chunk("", 0, opens_reasoning=True), chunk("Hm", 1), chunk("m.", 2), chunk("</think>", 3),
              chunk("\n\nYes", 4), chunk("!", 5, "stop")]
    for piece in stream:
        out += events.of(0, piece)
    assert "".join(e.text for e in out if isinstance(e, ReasoningDelta)) == "Hmm."
    assert "".join(e.text for e in out if isinstance(e, TextDelta)) == "\n\nYes!"
    finish = [e for e in out if isinstance(e, Finish)][0]
    assert (finish.usage.completion_tokens, finish.usage.reasoning_tokens) == (5, 3)


def test_a_backends_reasoning_is_relayed_and_the_controls_forwarded():
    request = GenerationRequest("r", 64, messages=[{"role": "user", "content": "hi"}],
                                chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low",
                                reasoning_budget=32)
    body = request_body(request, "up")
    assert (body["chat_template_kwargs"], body["reasoning_effort"], body["reasoning"]) == (
        {"enable_thinking": False}, "low", {"max_tokens": 32})
    reader = StreamReader()
    got = reader.feed(b'data: {"choices": [{"delta": {"reasoning_content": "Hmm"}}]}\n\n'
                      b'data: {"choices": [{"delta": {"reasoning": " ok", "content": "Yes"}}]}\n\n')
    assert (got.reasoning, got.text) == ("Hmm ok", "Yes")
    whole = whole_answer(json.dumps({
        "choices": [{"message": {"content": "Yes", "reasoning_content": "Hmm"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 2}},
    }).encode())
    assert (whole[0].reasoning, whole[-1].reasoning_tokens) == ("Hmm", 2)
    events = ChoiceEvents()
    out = [e for c in whole for e in events.of(0, c)]
    assert [type(e).__name__ for e in out] == ["ReasoningDelta", "TextDelta", "Finish"]
    assert out[-1].usage.reasoning_tokens == 2


def test_tool_call_ids_come_out_of_the_splitter_as_calls(qwen3_tokenizer):
    splitter = AnswerSplitter(formats.resolve(qwen3_tokenizer), None, reasoning.resolve(qwen3_tokenizer))
    events = run(splitter, ["<think>x</think>", WEATHER_CALL])
    assert [type(e) for e in events if isinstance(e, ToolCallStart)] == [ToolCallStart]
    chunks = ChoiceEvents(formats.resolve(qwen3_tokenizer), None, reasoning.resolve(qwen3_tokenizer))
    out = chunks.of(0, chunk("<think>x</think>" + WEATHER_CALL, 9, "stop"))
    assert [e.name for e in out if isinstance(e, ToolCallDelta) and e.name] == ["get_weather"]
    assert [e.reason for e in out if isinstance(e, Finish)] == ["tool_calls"]


def test_the_registry_checks_reasoning_parser_and_template_kwargs(tmp_path: Path):
    from mlxd.errors import ConfigError
    from mlxd.registry.loader import load_registry
    from support.daemon import write_registry

    good = write_registry(tmp_path, [{"name": "t", "path": str(zoo_model("qwen3")), "reasoning_parser": "qwen3",
                                      "chat_template_kwargs": {"enable_thinking": False}}])
    spec = load_registry(good).models[0]
    assert (spec.reasoning_parser, spec.template_defaults()) == ("qwen3", {"enable_thinking": False})
    bad = write_registry(tmp_path, [{"name": "t", "model": "qwen", "reasoning_parser": "thinky"}])
    with pytest.raises(ConfigError, match="reasoning_parser") as error:
        load_registry(bad)
    assert "harmony" in str(error.value)
    reserved = write_registry(tmp_path, [{"name": "t", "model": "qwen", "chat_template_kwargs": {"tokenize": True}}])
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        load_registry(reserved)


def test_a_budget_ends_harmonys_analysis_and_the_answer_follows_in_the_final_channel(harmony):
    import mlx.core as mx

    from mlxd.engine.reasoning_budget import reasoning_phase

    fmt = reasoning.resolve(harmony)
    budget = 4
    phase = reasoning_phase(fmt, opens=False, budget=budget, after=[])
    assert phase is not None and reasoning_phase(fmt, opens=False, budget=None, after=[]) is None
    # A model that opens the analysis channel and would reason forever.
    header = harmony.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
    filler = harmony.encode("m", add_special_tokens=False)[-1]
    prompt = harmony.encode("<|start|>assistant", add_special_tokens=False)
    tokens = list(prompt)
    for step in range(len(header) + budget + len(fmt.force_ids) + 3):
        wanted = header[step] if step < len(header) else filler
        logits = mx.zeros((1, harmony.vocab_size + 200)).at[0, wanted].add(10.0)
        tokens.append(int(mx.argmax(phase(mx.array(tokens), logits), axis=-1).item()))
    answer = split_answer(None, harmony.decode(tokens[len(prompt):]), reasoning=fmt)
    assert answer.reasoning == harmony.decode([filler] * budget)
    assert answer.content == harmony.decode([filler] * 3)
    # The budget's tokens, the header and <|end|>: the final channel's header is the answer's.
    assert phase.reasoning_tokens(len(tokens) - len(prompt)) == len(header) + budget + 1


def test_a_forced_call_on_harmony_may_reason_first_and_the_budget_ends_the_analysis(harmony):
    # The model is free to open the analysis channel before a forced call, as
    # gpt-oss does unforced; a spent budget closes it and the grammar goes on
    # to a call that harmony's parser reads and the schema accepts.
    import jsonschema
    import mlx.core as mx

    from mlxd.engine.reasoning_budget import reasoning_phase
    from mlxd.grammar.compiler import GrammarCompiler
    from mlxd.grammar.processor import GrammarProcessor
    from mlxd.tools.forcing import forced_call
    from mlxd.tools.output_specs import ToolSpec

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}
    tools = [ToolSpec("get_weather", "tools[0]", parameters=schema)]
    tool_format, fmt = formats.resolve(harmony), reasoning.resolve(harmony)
    width = harmony.vocab_size + 200
    compiler = GrammarCompiler(harmony, width)
    budget = 4
    channel = harmony.convert_tokens_to_ids("<|channel|>")
    filler = harmony.encode("m", add_special_tokens=False)[-1]
    prompt = harmony.encode("<|start|>assistant", add_special_tokens=False)

    def generate(budget: int | None) -> tuple[list[int], object]:
        grammar = GrammarProcessor(compiler.matcher(forced_call(tool_format, tools)), compiler.mask_size,
                                   compiler.eos_token_ids)
        phase = reasoning_phase(fmt, opens=False, budget=budget, after=[grammar])
        step = phase or grammar
        tokens = list(prompt)
        for _ in range(60):
            # A model that would open the analysis channel, then reason forever.
            logits = mx.zeros((1, width)).at[0, channel].add(20.0).at[0, filler].add(10.0)
            token = int(mx.argmax(step(mx.array(tokens), logits), axis=-1).item())
            if token in compiler.eos_token_ids:
                break
            tokens.append(token)
        return tokens[len(prompt):], phase

    answer, phase = generate(budget)
    split = split_answer(tool_format, harmony.decode(answer), tools, reasoning=fmt)
    assert split.reasoning == harmony.decode([filler] * budget) and split.content == ""
    [call] = split.tool_calls
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), schema)
    header = harmony.encode(formats.HARMONY_ANALYSIS, add_special_tokens=False)
    # The analysis header, the budget's tokens and the <|end|> it forced.
    assert phase.reasoning_tokens(len(answer) + 1) == len(header) + budget + 1
    # No budget: the grammar holds the model in the analysis until max_tokens.
    unbounded, _ = generate(None)
    assert split_answer(tool_format, harmony.decode(unbounded), tools, reasoning=fmt).tool_calls == []
