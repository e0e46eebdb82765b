"""A prefill: the answer continues the conversation's last assistant
message (Anthropic's final ``assistant`` message, vLLM's
``continue_final_message`` on chat). Against a real daemon through the
official clients; the prompt as the model saw it is read back from request
capture (``/v1/captures``), with the tiny chatml model's template and the
zoo's Qwen3 one (a thinking template that writes a think block into every
last assistant turn)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from agents.agents_support import KEY, PROMPT, WEATHER
from support.daemon import daemon_in_thread, write_registry
from vision.vision_support import tiny_vision_model
from zoo.zoo_support import zoo_model

pytestmark = pytest.mark.mlx

AUTH = {"authorization": f"Bearer {KEY}"}
PREFILL = "Here is the report:"
GREEDY = {"temperature": 0}  # (the anthropic client takes sampling fields through extra_body)
ASKED = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefill")
    registry = write_registry(tmp, [
        {"name": "qwen", "model": "qwen"},
        {"name": "qwen3", "path": str(zoo_model("qwen3"))},
        {"name": "eyes", "path": str(tiny_vision_model())},
    ], server={"api_keys": [KEY]})
    with daemon_in_thread(registry, tmp) as d:
        assert httpx.put(f"{d.url}/v1/capture", json={"enabled": True}, headers=AUTH).status_code == 200
        yield d


@pytest.fixture
def claude(daemon):
    return anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0)


@pytest.fixture
def gpt(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)


def captured(daemon, response_id: str) -> dict:
    return httpx.get(f"{daemon.url}/v1/captures/{response_id}", headers=AUTH).json()


def continued_greedily(daemon, model: str, prompt: str, max_tokens: int) -> str:
    """What the model writes after ``prompt`` as raw text (no template)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{daemon.url}/v1/completions", json=body, headers=AUTH, timeout=60).json()["choices"][0]["text"]


@pytest.mark.parametrize("content", [PREFILL, [{"type": "text", "text": "Here is "}, {"type": "text", "text": "the report:"}]])
def test_an_anthropic_prefill_is_continued_not_answered_afresh(claude, daemon, content):
    messages = [*ASKED, {"role": "assistant", "content": content}]
    reply = claude.messages.create(model="qwen", max_tokens=12, messages=messages, extra_body=GREEDY)
    prompt = captured(daemon, reply.id)["prompt"]
    # The prompt ends with the prefill, inside the assistant turn: no turn
    # closed after it, no new assistant turn opened.
    assert prompt.endswith("<|im_start|>assistant\n" + PREFILL), prompt[-200:]
    assert prompt.count("<|im_start|>assistant") == 1
    text = reply.content[0].text
    assert text and not text.startswith(PREFILL)
    # The answer is exactly what the model writes after the prefill.
    assert text == continued_greedily(daemon, "qwen", prompt, 12)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == captured(daemon, reply.id)["prompt_tokens"]

    with claude.messages.stream(model="qwen", max_tokens=12, messages=messages, extra_body=GREEDY) as stream:
        assert stream.get_final_message().content[0].text == text
    counted = claude.messages.count_tokens(model="qwen", messages=messages)
    assert counted.input_tokens == captured(daemon, reply.id)["prompt_tokens"]


def test_a_prefill_on_a_thinking_template_is_the_answer_after_its_think_block(claude, daemon):
    """Qwen3's template writes ``<think>`` ... ``</think>`` into the last
    assistant turn (the prefill's thinking block, or an empty one): the
    prompt goes on from the text after it, and the answer is text."""
    for thought, think in (([], "<think>\n\n</think>\n\n"),
                           ([{"type": "thinking", "thinking": "The file is YAML.", "signature": "x"}],
                            "<think>\nThe file is YAML.\n</think>\n\n")):
        messages = [*ASKED, {"role": "assistant", "content": [*thought, {"type": "text", "text": PREFILL}]}]
        reply = claude.messages.create(model="qwen3", max_tokens=8, messages=messages, extra_body=GREEDY)
        prompt = captured(daemon, reply.id)["prompt"]
        assert prompt.endswith("<|im_start|>assistant\n" + think + PREFILL), prompt[-200:]
        assert [b.type for b in reply.content] == ["text"]
        assert reply.content[0].text == continued_greedily(daemon, "qwen3", prompt, 8)


def test_several_thinking_blocks_reach_the_template_a_blank_line_apart(claude, daemon):
    messages = [*ASKED, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The file is YAML.", "signature": "x"},
        {"type": "thinking", "thinking": "Two keys are wrong.", "signature": "x"},
        {"type": "text", "text": PREFILL},
    ]}]
    reply = claude.messages.create(model="qwen3", max_tokens=4, messages=messages)
    assert captured(daemon, reply.id)["prompt"].endswith(
        "<think>\nThe file is YAML.\n\nTwo keys are wrong.\n</think>\n\n" + PREFILL)


def test_an_anthropic_prefill_with_thinking_or_a_json_format_is_a_400(claude):
    """As Anthropic: a prefill is not available with extended thinking. A
    grammar over the whole answer cannot hold an answer already begun."""
    messages = [*ASKED, {"role": "assistant", "content": "{"}]
    with pytest.raises(anthropic.BadRequestError) as thinking:
        claude.messages.create(model="qwen3", max_tokens=8, messages=messages,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    assert thinking.value.body["type"] == "error"
    assert "cannot think first" in thinking.value.body["error"]["message"]
    schema = {"type": "json_schema", "schema": WEATHER}
    with pytest.raises(anthropic.BadRequestError) as formatted:
        claude.messages.create(model="qwen", max_tokens=8, messages=messages, extra_body={"output_config": {
            "format": schema}})
    assert "output_config.format" in formatted.value.body["error"]["message"]


def test_a_stop_sequence_in_the_continuation_ends_it(claude, daemon):
    messages = [*ASKED, {"role": "assistant", "content": PREFILL}]
    full = claude.messages.create(model="qwen", max_tokens=30, messages=messages, extra_body=GREEDY).content[0].text
    stop = full[len(full) // 2: len(full) // 2 + 4]
    assert stop.strip(), full
    # "report" is in the prefill: only what the model writes is matched.
    reply = claude.messages.create(model="qwen", max_tokens=30, messages=messages, extra_body=GREEDY,
                                   stop_sequences=["report", stop])
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", stop)
    assert reply.content[0].text == full[: full.find(stop)]


def test_a_prefill_reuses_the_cached_conversation_before_it(claude):
    question = [{"role": "user", "content": PROMPT + " in the second file"}]
    plain = claude.messages.create(model="qwen", max_tokens=4, messages=question, extra_body=GREEDY)
    prefilled = claude.messages.create(model="qwen", max_tokens=4, extra_body=GREEDY,
                                       messages=[*question, {"role": "assistant", "content": PREFILL}])
    assert prefilled.usage.cache_read_input_tokens >= plain.usage.input_tokens + plain.usage.cache_read_input_tokens


def test_openai_chat_continues_the_final_message_when_asked_as_vllm_does(gpt, claude, daemon):
    messages = [*ASKED, {"role": "assistant", "content": PREFILL}]
    ask = {"model": "qwen", "max_tokens": 12, "temperature": 0, "messages": messages}
    reply = gpt.chat.completions.create(**ask, extra_body={"continue_final_message": True,
                                                           "add_generation_prompt": False})
    prompt = captured(daemon, reply.id)["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n" + PREFILL), prompt[-200:]
    text = reply.choices[0].message.content
    assert text == continued_greedily(daemon, "qwen", prompt, 12) and not text.startswith(PREFILL)
    # The same answer as Anthropic's prefill; continue_final_message alone says it too, and so does a stream.
    assert text == claude.messages.create(model="qwen", max_tokens=12, messages=messages,
                                          extra_body=GREEDY).content[0].text
    streamed = gpt.chat.completions.create(**ask, stream=True, extra_body={"continue_final_message": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_openai_chat_without_the_flags_answers_a_final_assistant_message_in_a_new_turn(gpt, daemon):
    messages = [*ASKED, {"role": "assistant", "content": PREFILL}]
    reply = gpt.chat.completions.create(model="qwen", max_tokens=4, messages=messages)
    assert captured(daemon, reply.id)["prompt"].endswith(PREFILL + "<|im_end|>\n<|im_start|>assistant\n")
    # add_generation_prompt false alone: the conversation as the template renders it, nothing added.
    reply = gpt.chat.completions.create(model="qwen", max_tokens=4, messages=messages,
                                        extra_body={"add_generation_prompt": False})
    assert captured(daemon, reply.id)["prompt"].endswith(PREFILL + "<|im_end|>\n")


@pytest.mark.parametrize(("messages", "flags", "said"), [
    ([*ASKED, {"role": "assistant", "content": PREFILL}], {"continue_final_message": True,
                                                           "add_generation_prompt": True}, "Cannot set both"),
    (ASKED, {"continue_final_message": True}, "the last message here is a user message"),
    ([*ASKED, {"role": "assistant", "content": "{"}], {"continue_final_message": True,
                                                       "response_format": {"type": "json_object"}}, "response_format"),
    ([*ASKED, {"role": "assistant", "content": "{"}], {"continue_final_message": True,
                                                       "reasoning_effort": "none", "reasoning": {"enabled": True}},
     "cannot think first"),
])
def test_openai_chat_refuses_what_cannot_continue_a_message(gpt, messages, flags, said):
    with pytest.raises(openai.BadRequestError) as refused:
        gpt.chat.completions.create(model="qwen3", max_tokens=4, messages=messages, extra_body=flags)
    assert said in refused.value.body["message"], refused.value.body


def test_a_vision_model_continues_a_prefill_too(claude, daemon):
    from mlxd.engine.vision_inputs import load_vision_processor, prepare_vision_inputs

    messages = [*ASKED, {"role": "assistant", "content": PREFILL}]
    vision = load_vision_processor(tiny_vision_model())
    prompt = prepare_vision_inputs(vision.processor, vision.config, messages=messages, end="continue").prompt
    assert prompt.endswith("<|im_start|>assistant\n" + PREFILL)
    reply = claude.messages.create(model="eyes", max_tokens=8, messages=messages, extra_body=GREEDY)
    assert reply.content[0].text == continued_greedily(daemon, "eyes", prompt, 8)


@pytest.mark.parametrize("prefill", ["Here is the report: ", "Here is the report:\n"])
def test_an_anthropic_prefill_ending_in_whitespace_is_a_400_as_anthropic_answers(claude, prefill):
    messages = [*ASKED, {"role": "assistant", "content": prefill}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="qwen", max_tokens=8, messages=messages)
    assert refused.value.body["error"]["message"] == (
        "messages: final assistant content cannot end with trailing whitespace")
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="qwen", messages=messages)
