"""The between-turn prefill's decisions (``mlxd.engine.next_turn``): pure
functions, and the cut on the zoo's real templates (tokenizer only)."""

from __future__ import annotations

from typing import Any

import pytest
from zoo.zoo_support import zoo_model

from mlxd.engine import next_turn
from mlxd.engine.next_turn import AUTO, MIN_LOST, Answer, skip_reason, wanted, worth
from mlxd.engine.prompt import common_prefix, prompt_tokens
from mlxd.engine.types import GenerationRequest

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project and return its text.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
HISTORY = [{"role": "system", "content": "You are a careful coding agent for a Python code base."},
           {"role": "user", "content": "Read the configuration file and report the options"}]


def chat(**kwargs: Any) -> GenerationRequest:
    return GenerationRequest(request_id="r", max_tokens=8, messages=list(HISTORY), **kwargs)


def test_only_a_chat_answer_that_ended_by_itself_or_at_its_length_goes_on():
    on = {"setting": AUTO, "cache_on": True}
    assert skip_reason(chat(), "stop", **on) is None
    assert skip_reason(chat(), "length", **on) is None
    assert skip_reason(chat(), "abort", **on) == "did not finish"
    assert skip_reason(chat(warmup=True), "stop", **on) == "warm-up"
    assert skip_reason(chat(choices=2), "stop", **on) == "one of several choices"
    completion = GenerationRequest(request_id="r", max_tokens=8, prompt="Once upon")
    assert skip_reason(completion, "stop", **on) == "not a chat"
    assert skip_reason(chat(), "stop", setting=False, cache_on=True) == "off"
    assert skip_reason(chat(), "stop", setting=True, cache_on=False) == "no prefix cache"


def test_auto_wants_it_only_where_the_template_moves_the_prompt():
    assert wanted(True, None) and wanted(True, 0)
    assert not wanted(False, 10_000)
    assert wanted(AUTO, MIN_LOST) and not wanted(AUTO, MIN_LOST - 1)
    # A template the probe cannot render: no prefill under auto.
    assert not wanted(AUTO, None)


def test_worth_it_per_answer():
    prompt = list(range(1000))
    moved = prompt[:800] + [7] * 300  # the next turn gives up 200 tokens of the prompt
    extended = prompt + [7] * 20  # it only adds the answer and a few tokens
    assert worth(AUTO, prompt, moved) and worth(True, prompt, moved)
    assert not worth(AUTO, prompt, extended)
    assert worth(True, prompt, extended)
    assert not worth(True, prompt, prompt[:500])


def test_the_sentinel_answer_message_carries_tool_calls():
    call = {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    assert Answer("hi").message() == {"role": "assistant", "content": "hi"}
    assert Answer("", (call,)).message()["tool_calls"] == [call]


@pytest.mark.parametrize("family, moves", [("mistral3", True), ("qwen3", False), ("qwen3_5", False),
                                           ("gpt_oss", False), ("gemma3_text", False)])
def test_the_cut_is_a_prefix_of_the_real_next_prompt(family, moves):
    """On each family's real template: the next turn's known part is exactly
    the start of the next request's prompt, whatever its message says, and
    ``auto``'s probe finds only Mistral's moving tool list."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(zoo_model(family))
    request = chat(tools=TOOLS)
    answer = "The configuration sets the port."
    following = next_turn.next_prompt(tokenizer, request, Answer(answer))
    for message in ("Thanks. Now the tests?", " leading space", "\nnew line", "Xq7 same start as a sentinel"):
        real = prompt_tokens(tokenizer, GenerationRequest(request_id="n", max_tokens=8, tools=TOOLS, messages=[
            *HISTORY, {"role": "assistant", "content": answer}, {"role": "user", "content": message}]))
        assert common_prefix(following, real) == len(following), message
        # It holds everything but the new message (a few tokens of it at most).
        assert len(real) - len(following) < 40
    prompt = prompt_tokens(tokenizer, request)
    assert worth(AUTO, prompt, following) is moves
    assert wanted(AUTO, next_turn.probe_loss(tokenizer)) is moves


def test_recent_user_texts_are_distinct_and_newest_first():
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "b"}, {"role": "user", "content": [{"type": "text", "text": "c"}]},
                {"role": "user", "content": "a"}]
    assert next_turn.recent_user_texts(messages, 2) == ["a", "b"]
    assert next_turn.recent_user_texts(messages, 5) == ["a", "b"]


@pytest.mark.parametrize("family, repeats", [("mistral3", 1), ("qwen3", 0)])
def test_only_a_template_that_renders_a_repeat_apart_gets_repeated_prompts(family, repeats):
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(zoo_model(family))
    request = chat(tools=TOOLS)
    answer = Answer("The configuration sets the port.")
    following = next_turn.next_prompt(tokenizer, request, answer)
    texts = next_turn.recent_user_texts(request.messages, next_turn.MAX_REPEATS)
    found = [t for t in (next_turn.repeated_prompt(tokenizer, request, answer, following, x) for x in texts) if t]
    assert len(found) == repeats
    for tokens in found:
        real = prompt_tokens(tokenizer, GenerationRequest(request_id="n", max_tokens=8, tools=TOOLS, messages=[
            *HISTORY, answer.message(), {"role": "user", "content": HISTORY[-1]["content"]}]))
        assert tokens == real


def test_n_choices_are_marked_so_none_gets_a_next_turn(tmp_path):
    from pathlib import Path

    from mlxd.api.openai.bodies import choices
    from mlxd.api.plan import Plan
    from mlxd.registry.model import ModelSpec

    plan = Plan(kind="chat", spec=ModelSpec(name="m", path=Path(tmp_path), source=str(tmp_path)),
                requested_name="m", requests=[chat()], stream=False, timeout=1.0)
    choices(plan, 1)
    assert plan.requests[0].choices == 1
    choices(plan, 3)
    assert [r.choices for r in plan.requests] == [3, 3, 3]
    assert all(skip_reason(r, "stop", setting=True, cache_on=True) for r in plan.requests)


def test_a_continued_message_is_sent_back_with_its_continuation_as_one_message():
    """A prefill's answer is only the continuation; the client sends back
    the prefill and it as one assistant message, so that is the next prompt
    to prefill (not a second assistant message after the prefill)."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(zoo_model("mistral3"))
    prefill = [{"type": "text", "text": "The configuration "}]
    request = chat(tools=TOOLS, prompt_end="continue")
    request.messages.append({"role": "assistant", "content": prefill})
    following = next_turn.next_prompt(tokenizer, request, Answer("sets the port."))
    real = prompt_tokens(tokenizer, GenerationRequest(request_id="n", max_tokens=8, tools=TOOLS, messages=[
        *HISTORY, {"role": "assistant", "content": "The configuration sets the port."},
        {"role": "user", "content": "Thanks. Now the tests?"}]))
    assert common_prefix(following, real) == len(following)
    assert len(real) - len(following) < 40
    # add_generation_prompt false alone: the answer is no known turn, so nothing is prefilled after it.
    assert skip_reason(chat(prompt_end="as_is"), "stop", setting=AUTO, cache_on=True) == "no new turn"
