"""Thinking models end to end, through the official SDKs: reasoning apart
from the answer on every surface, streamed and not; the budget that ends
it; the controls that turn it off (the family's no-think prompt); the
registry's defaults under the request's; earlier turns' reasoning and the
prefix cache.

``thinker`` is the zoo's qwen3_5, whose template (Qwen3.5's) opens the
think block in the generation prompt: a random model never closes it, so
the reasoning budget (``reasoning.max_tokens``, Anthropic's
``budget_tokens``) ends it and the answer follows. ``qwen3`` is the zoo's
qwen3 with Qwen3's own template, where the model opens the block itself and
``enable_thinking: false`` closes it in the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import Daemon, daemon_in_thread, write_registry
from zoo.zoo_support import zoo_model

KEY = "sk-thinking"
PROMPT = "Read the configuration file and report the errors"
MESSAGES = [{"role": "user", "content": PROMPT}]
BUDGET = 5
# The budget's tokens, then the end marker it forces.
REASONING_TOKENS = BUDGET + 1


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("thinking")
    thinker, qwen3 = zoo_model("qwen3_5"), zoo_model("qwen3")
    registry = write_registry(tmp, [
        {"name": "thinker", "path": str(thinker)},
        {"name": "thinker-batched", "path": str(thinker), "max_concurrency": 2},
        # Codex sends an effort and no budget: the registry's ends the reasoning.
        {"name": "thinker-codex", "path": str(thinker), "max_context": 32768,
         "defaults": {"reasoning_budget": BUDGET, "max_tokens": 16}},
        {"name": "qwen3", "path": str(qwen3)},
        {"name": "qwen3-quiet", "path": str(qwen3), "chat_template_kwargs": {"enable_thinking": False}},
        # Nemotron-H's template reads /no_think in a turn, not enable_thinking.
        {"name": "nemo", "path": str(zoo_model("nemotron_h"))},
        # Qwen3-VL-Thinking's template opens the block too.
        {"name": "eyes", "path": str(zoo_model("qwen3_vl")), "kind": "vision"},
        {"name": "gpt-oss", "path": str(zoo_model("gpt_oss"))},
    ], server={"api_keys": [KEY]})
    with daemon_in_thread(registry, tmp) as d:
        yield d


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(zoo_model("qwen3"))


@pytest.fixture(scope="module")
def gpt_oss_tokenizer():
    from mlx_lm.tokenizer_utils import load

    return load(zoo_model("gpt_oss"))


def openai_client(daemon: Daemon):
    import openai

    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)


def anthropic_client(daemon: Daemon):
    import anthropic

    return anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0)


def chat(daemon: Daemon, model: str = "thinker", **extra):
    return openai_client(daemon).chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=20, temperature=0, extra_body=extra
    )


def test_chat_gives_the_reasoning_apart_from_the_answer_streamed_and_not(daemon: Daemon):
    answer = chat(daemon, reasoning={"max_tokens": BUDGET})
    message = answer.choices[0].message
    extra = message.model_extra
    assert extra["reasoning_content"] and extra["reasoning"] == extra["reasoning_content"]
    assert message.content  # the answer after the budget ended the reasoning
    assert "<think>" not in message.content + extra["reasoning"] and "</think>" not in message.content
    assert answer.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    stream = openai_client(daemon).chat.completions.create(
        model="thinker", messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    reasoning, content, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta.model_extra or {}
            assert delta.get("reasoning") == delta.get("reasoning_content")
            reasoning.append(delta.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert ("".join(reasoning), "".join(content)) == (extra["reasoning_content"], message.content)
    assert usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    # The batched path splits and budgets the same.
    batched = chat(daemon, "thinker-batched", reasoning={"max_tokens": BUDGET}).choices[0].message
    assert (batched.model_extra["reasoning_content"], batched.content) == (extra["reasoning_content"], message.content)


def test_reasoning_exclude_hides_the_reasoning_on_every_surface_and_the_model_still_thinks(daemon: Daemon):
    shown = chat(daemon, reasoning={"max_tokens": BUDGET}).choices[0].message
    for extra in ({"reasoning": {"max_tokens": BUDGET, "exclude": True}},
                  {"reasoning": {"max_tokens": BUDGET}, "include_reasoning": False}):
        hidden = chat(daemon, **extra)
        message = hidden.choices[0].message
        assert not {"reasoning_content", "reasoning"} & set(message.model_extra or {})
        # The same answer as with the reasoning shown: it was thought, then left out.
        assert message.content == shown.content
        assert hidden.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    stream = openai_client(daemon).chat.completions.create(
        model="thinker", messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
        extra_body={"reasoning": {"max_tokens": BUDGET, "exclude": True}},
    )
    chunks = [c for chunk in stream for c in chunk.choices]
    assert not any({"reasoning_content", "reasoning"} & set(c.delta.model_extra or {}) for c in chunks)
    assert "".join(c.delta.content or "" for c in chunks) == shown.content
    response = openai_client(daemon).responses.create(
        model="thinker", input=PROMPT, max_output_tokens=20, temperature=0,
        extra_body={"reasoning": {"max_tokens": BUDGET, "exclude": True}},
    )
    assert [item.type for item in response.output] == ["message"]
    assert response.output[0].content[0].text == shown.content
    assert response.usage.output_tokens_details.reasoning_tokens == REASONING_TOKENS
    refused = httpx.post(f"{daemon.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=30,
                         json={"model": "thinker", "messages": MESSAGES, "reasoning": {"exclude": "yes"}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning.exclude"


def test_a_vision_model_reasons_apart_from_its_answer_too(daemon: Daemon):
    from vision.vision_support import data_url, image_chat, noise_image

    answer = openai_client(daemon).chat.completions.create(
        model="eyes", messages=image_chat(data_url(noise_image())), max_tokens=10, temperature=0,
        extra_body={"reasoning": {"max_tokens": 3}},
    )
    message = answer.choices[0].message
    assert message.model_extra["reasoning_content"] and message.content
    assert "</think>" not in message.content + message.model_extra["reasoning_content"]
    assert answer.usage.completion_tokens_details.reasoning_tokens == 3 + 1


def test_anthropic_thinking_blocks_with_a_budget(daemon: Daemon):
    client = anthropic_client(daemon)
    # (This SDK has no temperature argument any more: greedy through the body.)
    asked = dict(model="thinker", max_tokens=20, messages=MESSAGES, extra_body={"temperature": 0},
                 thinking={"type": "enabled", "budget_tokens": BUDGET})
    message = client.messages.create(**asked)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking and message.content[1].text
    with client.messages.stream(**asked) as stream:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content]
    deltas = [d for kind, d in kinds if kind == "content_block_delta"]
    first_text = deltas.index("text_delta")
    assert set(deltas[:first_text]) == {"thinking_delta", "signature_delta"} and deltas[first_text - 1] == "signature_delta"
    # Claude Code sends the thinking back with the next turn: accepted, and the
    # family's template drops it from earlier turns.
    history = [*MESSAGES, {"role": "assistant", "content": [b.model_dump() for b in message.content]},
               {"role": "user", "content": "And then?"}]
    without = [*MESSAGES, {"role": "assistant", "content": message.content[1].text}, {"role": "user", "content": "And then?"}]
    counted = [client.messages.count_tokens(model="thinker", messages=m).input_tokens for m in (history, without)]
    assert counted[0] == counted[1]


def test_an_anthropic_reply_cut_while_thinking_is_its_thinking_block_streamed_or_not(daemon: Daemon):
    # The whole message had an empty text block after the thinking, where the
    # stream (and Anthropic) end with the thinking block alone; Claude Code sends
    # the blocks back, and Anthropic refuses an empty text block.
    client = anthropic_client(daemon)
    asked = dict(model="thinker", max_tokens=4, messages=MESSAGES, extra_body={"temperature": 0})
    message = client.messages.create(**asked)
    with client.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    for reply in (message, final):
        assert [b.type for b in reply.content] == ["thinking"] and reply.stop_reason == "max_tokens"
    assert message.content[0].thinking == final.content[0].thinking


def test_anthropic_display_omitted_keeps_empty_thinking_blocks_and_the_same_answer(daemon: Daemon):
    # Anthropic's own way to leave reasoning out (Claude Code sends it): the
    # blocks stay, with their text empty, so a client that sends them back
    # keeps working; the model thinks as it would.
    client = anthropic_client(daemon)
    asked = dict(model="thinker", max_tokens=20, messages=MESSAGES, extra_body={"temperature": 0})
    shown = client.messages.create(**asked, thinking={"type": "enabled", "budget_tokens": BUDGET})
    for thinking in ({"type": "enabled", "budget_tokens": BUDGET, "display": "omitted"},
                     {"type": "adaptive", "display": "omitted"}):
        hidden = client.messages.create(**asked, thinking=thinking)
        if "budget_tokens" in thinking:
            assert [(b.type, getattr(b, "thinking", None)) for b in hidden.content] == [("thinking", ""), ("text", None)]
            assert hidden.content[1].text == shown.content[1].text
        else:  # No budget: the random model thinks until max_tokens.
            assert [(b.type, getattr(b, "thinking", None)) for b in hidden.content] == [("thinking", "")]
    with client.messages.stream(**asked, thinking={"type": "enabled", "budget_tokens": BUDGET,
                                                    "display": "omitted"}) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" not in deltas and deltas[0] == "signature_delta"
    assert [(b.type, getattr(b, "thinking", None)) for b in final.content] == [("thinking", ""), ("text", None)]
    assert final.content[1].text == shown.content[1].text
    refused = httpx.post(f"{daemon.url}/v1/messages", headers={"x-api-key": KEY}, timeout=30, json={
        **asked, "thinking": {"type": "adaptive", "display": "hidden"}})
    assert refused.status_code == 400 and "thinking.display" in refused.json()["error"]["message"]


def test_an_omitted_thinking_block_sent_back_brings_its_reasoning_back(daemon: Daemon):
    # Claude Code asks for omitted thinking and sends the empty blocks back
    # in its tool loop: their signature holds the reasoning, so the next
    # turn's prompt renders what the model thought (Qwen3.5's template keeps
    # the reasoning of the turns since the last user message), not an empty
    # think block.
    client = anthropic_client(daemon)
    thinking = {"type": "enabled", "budget_tokens": BUDGET}
    asked = dict(model="thinker", max_tokens=20, messages=MESSAGES, extra_body={"temperature": 0})
    shown = client.messages.create(**asked, thinking=thinking)
    hidden = client.messages.create(**asked, thinking={**thinking, "display": "omitted"})
    with client.messages.stream(**asked, thinking={**thinking, "display": "omitted"}) as stream:
        streamed = stream.get_final_message()
    reasoning = shown.content[0].thinking
    assert reasoning and hidden.content[0].thinking == "" and hidden.content[0].signature
    assert streamed.content[0].signature == hidden.content[0].signature

    tools = [{"name": "read", "description": "Reads a file.",
              "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]

    def tool_loop(block: dict) -> list[dict]:
        return [*MESSAGES,
                {"role": "assistant", "content": [block, {"type": "tool_use", "id": "toolu_1", "name": "read",
                                                          "input": {"path": "a.txt"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}]}]

    def counted(block: dict) -> int:
        return client.messages.count_tokens(model="thinker", messages=tool_loop(block), tools=tools,
                                            thinking=thinking).input_tokens

    sent_back = counted({"type": "thinking", "thinking": "", "signature": hidden.content[0].signature})
    assert sent_back == counted({"type": "thinking", "thinking": reasoning, "signature": ""})
    # An empty block with a signature mlxd did not write is no reasoning, as before.
    assert sent_back > counted({"type": "thinking", "thinking": "", "signature": "EqQBCkgIARABGAIiQL"}) + 2


def test_responses_stream_reasoning_items_as_codex_reads_them(daemon: Daemon):
    body = {"model": "thinker", "input": PROMPT, "max_output_tokens": 20, "temperature": 0, "stream": True,
            "reasoning": {"effort": "low", "max_tokens": BUDGET, "summary": "auto"}}
    events = []
    with httpx.stream("POST", f"{daemon.url}/v1/responses", json=body, timeout=60,
                      headers={"authorization": f"Bearer {KEY}"}) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["reasoning", "message"]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = events[-1]
    # 20 tokens cut the answer after the reasoning: the stream ends with the
    # event that names that outcome, as Codex and the Agents SDK read it.
    assert done["type"] == "response.incomplete"
    assert done["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    reasoning, message = done["response"]["output"]
    assert reasoning["status"] == "completed" and message["status"] == "incomplete"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": deltas}]
    # A summary was asked for (Codex asks): a local model's is its reasoning, streamed alongside.
    summarized = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_summary_text.delta")
    assert summarized == deltas and reasoning["summary"] == [{"type": "summary_text", "text": deltas}]
    assert kinds.index("response.reasoning_summary_part.added") < kinds.index("response.reasoning_summary_part.done")
    assert message["content"][0]["text"]
    assert done["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == REASONING_TOKENS
    # The SDK reads the same response whole, and a second turn continues it from the store.
    client = openai_client(daemon)
    first = client.responses.create(model="thinker", input=PROMPT, max_output_tokens=20, temperature=0,
                                    reasoning={"effort": "low"}, extra_body={"reasoning": {"max_tokens": BUDGET}})
    assert [item.type for item in first.output] == ["reasoning", "message"] and first.output[0].summary == []
    assert first.output[1].content[0].text == message["content"][0]["text"]
    second = client.responses.create(model="thinker", input="And then?", previous_response_id=first.id,
                                     max_output_tokens=4, temperature=0)
    # Still reasoning when max_output_tokens cut it: the reasoning item, no answer yet.
    assert (second.status, second.output[0].type) == ("incomplete", "reasoning")


def test_codex_cli_shows_the_reasoning_and_the_answer_of_a_thinking_model(daemon: Daemon, tmp_path: Path):
    # The real Codex CLI, configured as docs/agents.md shows, on a model whose
    # template opens the think block: its events carry a reasoning item and
    # the answer after it, as it reads them from the Responses stream.
    import shutil
    import subprocess

    from agents.test_agent_clis import _env, cli, doc_block, doc_shell

    codex = cli("codex")
    (tmp_path / ".codex").mkdir()
    config = doc_block("toml", "wire_api").replace("http://127.0.0.1:8080", daemon.url)
    (tmp_path / ".codex" / "config.toml").write_text(config.replace('model = "default"', 'model = "thinker-codex"'))
    exports, command = doc_shell("codex exec", daemon.url)
    exports["MLXD_API_KEY"] = KEY
    run = subprocess.run([codex, *command[1:-1], "--json", PROMPT], env=_env(tmp_path, **exports), cwd=tmp_path,
                         capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    done = {e["item"].get("type"): e["item"].get("text") for e in events if e.get("type") == "item.completed"}
    assert done.get("reasoning") and done.get("agent_message"), run.stdout[-3000:]
    assert "<think>" not in done["reasoning"] + done["agent_message"] and "</think>" not in done["agent_message"]
    # A random model never ends its answer: defaults.max_tokens cuts it, which
    # Codex reports as an incomplete turn (exit 1); nothing else may go wrong.
    errors = {e.get("message") for e in events if e.get("type") == "error"}
    assert run.returncode == 0 or errors == {"Incomplete response returned, reason: max_output_tokens"}, run.stdout
    shutil.rmtree(tmp_path / ".codex", ignore_errors=True)


def test_earlier_reasoning_is_dropped_as_the_template_does_and_the_cache_still_hits(daemon: Daemon, qwen3_tokenizer):
    first = chat(daemon, "qwen3")
    answer = first.choices[0].message.content
    turn = [*MESSAGES, {"role": "assistant", "content": answer, "reasoning_content": "I looked at the file."},
            {"role": "user", "content": "And then?"}]
    rendered = qwen3_tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    assert "I looked at the file." not in rendered  # Qwen3 keeps reasoning only after the last question
    second = openai_client(daemon).chat.completions.create(model="qwen3", messages=turn, max_tokens=4, temperature=0)
    assert second.usage.prompt_tokens == len(qwen3_tokenizer.encode(rendered, add_special_tokens=False))
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    # Reasoning after the last question (a tool-call turn) is the template's to render.
    ongoing = [*MESSAGES, {"role": "assistant", "content": answer, "reasoning_content": "I looked at the file."}]
    kept = qwen3_tokenizer.apply_chat_template(ongoing, tokenize=False)
    assert "I looked at the file." in kept


def test_codexs_reasoning_before_parallel_calls_reaches_the_template(daemon: Daemon, qwen3_tokenizer):
    # Codex sends a turn back as a reasoning item (encrypted_content null), then
    # one function_call item per call: the reasoning is the calls' message's,
    # which Qwen3 renders after the last question. It was dropped once a second
    # call joined the message.
    calls = [("call_1", '{"path": "."}'), ("call_2", '{"path": "/tmp"}')]
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]},
        {"type": "reasoning", "id": "rs_1", "encrypted_content": None,
         "summary": [{"type": "summary_text", "text": "Both folders need a listing."}]},
        *({"type": "function_call", "call_id": i, "name": "ls", "arguments": a} for i, a in calls),
        *({"type": "function_call_output", "call_id": i, "output": f"{i}.txt"} for i, _ in calls),
    ]
    answer = openai_client(daemon).responses.create(model="qwen3", input=items, max_output_tokens=1, store=False)
    same = [*MESSAGES, {"role": "assistant", "content": "", "reasoning_content": "Both folders need a listing.",
                        "tool_calls": [{"id": i, "type": "function", "function": {"name": "ls", "arguments": json.loads(a)}}
                                       for i, a in calls]},
            *({"role": "tool", "tool_call_id": i, "content": f"{i}.txt"} for i, _ in calls)]
    rendered = qwen3_tokenizer.apply_chat_template(same, add_generation_prompt=True, tokenize=False)
    assert "Both folders need a listing." in rendered
    assert answer.usage.input_tokens == len(qwen3_tokenizer.encode(rendered, add_special_tokens=False))


LS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def test_gpt_oss_takes_back_its_own_answer_of_analysis_preamble_and_call(daemon: Daemon, gpt_oss_tokenizer):
    # gpt-oss writes an analysis, a commentary preamble and the call: mlxd
    # answers reasoning, text and a tool call, and clients send all three back.
    # Its template refuses a tool-call turn with both content and thinking (a
    # 400 on the next turn); it has room for the analysis, which is kept.
    called = [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]
    result = {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}
    chat = openai_client(daemon).chat.completions.create(model="gpt-oss", max_tokens=1, messages=[
        *MESSAGES, {"role": "assistant", "content": "Let me look.", "reasoning_content": "I list it.", "tool_calls": called},
        result])
    claude_code = anthropic_client(daemon).messages.create(model="gpt-oss", max_tokens=1, messages=[
        *MESSAGES,
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "I list it.", "signature": ""},
                                          {"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "call_1", "name": "ls", "input": {"path": "."}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "a.txt"}]}])
    kept = [*MESSAGES, {"role": "assistant", "content": "", "thinking": "I list it.",
                        "tool_calls": [{**called[0], "function": {"name": "ls", "arguments": {"path": "."}}}]}, result]
    rendered = gpt_oss_tokenizer.apply_chat_template(kept, add_generation_prompt=True)
    assert chat.usage.prompt_tokens == len(rendered)
    assert claude_code.usage.input_tokens + claude_code.usage.cache_read_input_tokens == len(rendered)


def test_a_tool_without_a_description_is_rendered_on_gpt_oss(daemon: Daemon, gpt_oss_tokenizer):
    # OpenAI's tools need no description; gpt-oss's template adds it to a
    # string, so such a tool was a 400 there (Anthropic's and Responses' tools
    # reach the template with an empty one). It gets the empty one here too.
    bare = openai_client(daemon).chat.completions.create(
        model="gpt-oss", max_tokens=1, messages=MESSAGES,
        tools=[{"type": "function", "function": {"name": "ls", "parameters": LS}}])
    described = [{"type": "function", "function": {"name": "ls", "description": "", "parameters": LS}}]
    assert bare.usage.prompt_tokens == len(gpt_oss_tokenizer.apply_chat_template(
        MESSAGES, tools=described, add_generation_prompt=True))


def prompt_tokens(daemon: Daemon, model: str = "qwen3", **extra) -> int:
    return chat(daemon, model, **extra).usage.prompt_tokens


def test_turning_thinking_off_renders_the_familys_no_think_prompt(daemon: Daemon, qwen3_tokenizer):
    thinking = len(qwen3_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
    quiet = qwen3_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, enable_thinking=False,
                                                tokenize=False)
    assert quiet.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    no_think = len(qwen3_tokenizer.encode(quiet, add_special_tokens=False))
    assert no_think > thinking
    assert prompt_tokens(daemon) == thinking
    assert prompt_tokens(daemon, chat_template_kwargs={"enable_thinking": False}) == no_think
    assert prompt_tokens(daemon, reasoning_effort="none") == no_think
    assert prompt_tokens(daemon, reasoning={"enabled": False}) == no_think
    # The registry's default, and a request that turns it back on.
    assert prompt_tokens(daemon, "qwen3-quiet") == no_think
    assert prompt_tokens(daemon, "qwen3-quiet", chat_template_kwargs={"enable_thinking": True}) == thinking
    # Nothing of the answer is taken for reasoning: the prompt closed the block.
    assert "reasoning_content" not in (chat(daemon, "qwen3-quiet").choices[0].message.model_extra or {})
    client = anthropic_client(daemon)
    off = client.messages.create(model="qwen3", max_tokens=4, messages=MESSAGES, thinking={"type": "disabled"})
    assert off.usage.input_tokens + off.usage.cache_read_input_tokens == no_think
    counted = client.messages.count_tokens(model="qwen3", messages=MESSAGES, thinking={"type": "disabled"})
    assert counted.input_tokens == no_think
    assert client.messages.count_tokens(model="qwen3", messages=MESSAGES).input_tokens == thinking


def test_nemotron_h_turns_thinking_off_its_own_way_and_answers_without_reasoning(daemon: Daemon):
    thinking = chat(daemon, "nemo", max_tokens=6).choices[0].message
    assert thinking.model_extra["reasoning_content"]  # its prompt opens <think>: a random model never closes it
    flagged = openai_client(daemon).chat.completions.create(
        model="nemo", messages=[{"role": "system", "content": "/no_think"}, *MESSAGES], max_tokens=6, temperature=0)
    # (chat_template_kwargs' enable_thinking renders the same: test_zoo_reasoning.py.)
    answers = [flagged, chat(daemon, "nemo", max_tokens=6, reasoning_effort="none")]
    for answer in answers:
        message = answer.choices[0].message
        assert message.content and "reasoning_content" not in (message.model_extra or {})
        assert answer.usage.completion_tokens_details is None or not answer.usage.completion_tokens_details.reasoning_tokens
    assert {a.choices[0].message.content for a in answers} == {flagged.choices[0].message.content}
    off = anthropic_client(daemon).messages.create(model="nemo", max_tokens=6, messages=MESSAGES,
                                                   thinking={"type": "disabled"}, extra_body={"temperature": 0})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == flagged.choices[0].message.content


def test_structured_output_starts_after_the_reasoning(daemon: Daemon):
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    answer = chat(daemon, reasoning={"max_tokens": BUDGET},
                  response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}})
    message = answer.choices[0].message
    assert message.model_extra["reasoning_content"]
    assert json.loads(message.content)["city"] in ("Paris", "Rome")
    assert answer.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS


def test_a_forced_tool_call_comes_after_the_reasoning_and_parses(daemon: Daemon):
    from agents.agents_support import WEATHER

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    answer = chat(daemon, reasoning={"max_tokens": BUDGET}, tools=tools, tool_choice="required", max_tokens=80)
    choice = answer.choices[0]
    assert choice.message.model_extra["reasoning_content"] and choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] in ("Paris", "Rome", "Oslo")
    assert "<tool_call>" not in (choice.message.content or "") + choice.message.model_extra["reasoning_content"]


def test_reasoning_fields_a_client_got_wrong_are_400s(daemon: Daemon):
    headers = {"authorization": f"Bearer {KEY}"}
    base = {"model": "qwen3", "messages": MESSAGES, "max_tokens": 4}
    cases = [
        ({"reasoning_effort": "ultra"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": ["enable_thinking"]}, None),
        ({"reasoning": {"max_tokens": -1}}, "reasoning"),
    ]
    for extra, param in cases:
        response = httpx.post(f"{daemon.url}/v1/chat/completions", json={**base, **extra}, headers=headers, timeout=30)
        assert response.status_code in (400, 422), extra
        if param is not None:
            assert response.json()["error"]["param"] == param
    anthropic = {"model": "qwen3", "messages": MESSAGES, "max_tokens": 8}
    for thinking in ({"type": "sometimes"}, {"type": "enabled", "budget_tokens": 0}, {"type": "enabled", "budget_tokens": "8"}):
        response = httpx.post(f"{daemon.url}/v1/messages", json={**anthropic, "thinking": thinking}, headers=headers,
                              timeout=30)
        assert response.status_code == 400 and response.json()["type"] == "error", thinking
        assert "thinking" in response.json()["error"]["message"]


def test_mlxd_check_shows_the_reasoning_parser(tmp_path: Path):
    from typer.testing import CliRunner

    from mlxd.cli.main import app

    registry = write_registry(tmp_path, [
        {"name": "t", "path": str(zoo_model("qwen3")), "chat_template_kwargs": {"enable_thinking": False}},
        {"name": "plain", "model": "qwen", "reasoning_parser": "none"},
    ])
    result = CliRunner().invoke(app, ["check", str(registry)])
    assert result.exit_code == 0, result.output
    assert "reasoning: think (detected from the vocabulary)" in result.output
    assert "chat_template_kwargs: enable_thinking=false" in result.output
    assert "reasoning: off (reasoning_parser: none" in result.output
