"""Every zoo family's reasoning format, with its real template and tokens:
mlxd finds the markers mlx-lm finds (harmony for gpt-oss), ``mlxd check``
reads the same from the folder, and turning thinking off renders a prompt
that leaves no reasoning block open."""

from __future__ import annotations

import pytest
from zoo.zoo_support import CHAT, TEXT_FAMILIES, family, zoo_model

from mlxd.tools import reasoning


# Families whose template ignores the enable_thinking variable, and the switch it reads instead.
OWN_SWITCH = {"nemotron_h": "/no_think"}


@pytest.fixture(scope="module", params=TEXT_FAMILIES)
def loaded(request):
    from mlx_lm.tokenizer_utils import load

    return request.param, load(zoo_model(request.param))


def test_mlxd_finds_the_reasoning_markers_mlx_lm_finds(loaded):
    name, tokenizer = loaded
    fmt = reasoning.resolve(tokenizer)
    if name == "gpt_oss":
        assert fmt is not None and fmt.harmony
    elif family(name).think is None:
        assert fmt is None
    else:
        assert (fmt.start, fmt.end) == family(name).think == (tokenizer.think_start, tokenizer.think_end)
    assert reasoning.resolve_from_files(zoo_model(name)) == (fmt.name if fmt else None)


@pytest.mark.parametrize("name", [n for n in TEXT_FAMILIES if family(n).think])
def test_thinking_off_leaves_no_reasoning_block_open(name):
    from mlx_lm.tokenizer_utils import load

    from mlxd.engine.prompt import chat_tokens

    tokenizer = load(zoo_model(name))
    fmt = reasoning.resolve(tokenizer)
    if name in OWN_SWITCH:
        # Nemotron-H reads a system line, not the variable: the variable alone leaves it thinking...
        assert fmt.opens_in(list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False)))
        own = tokenizer.apply_chat_template([{"role": "system", "content": OWN_SWITCH[name]}, *CHAT],
                                            add_generation_prompt=True)
        assert not fmt.opens_in(list(own))
        # ...so mlxd turns it off the family's way, and renders just what its users' flag renders.
        assert chat_tokens(tokenizer, CHAT, template_kwargs={"enable_thinking": False}) == list(own)
        system = [{"role": "system", "content": "Be brief."}, *CHAT]
        flagged = [{"role": "system", "content": "Be brief. /no_think"}, *CHAT]
        assert chat_tokens(tokenizer, system, template_kwargs={"enable_thinking": False}) == \
            list(tokenizer.apply_chat_template(flagged, add_generation_prompt=True))
    off = chat_tokens(tokenizer, CHAT, template_kwargs={"enable_thinking": False})
    assert not fmt.opens_in(off)


def test_templates_that_open_the_block_are_read_as_reasoning_from_the_first_token():
    from mlx_lm.tokenizer_utils import load

    opening = []
    for name in TEXT_FAMILIES:
        tokenizer = load(zoo_model(name))
        fmt = reasoning.resolve(tokenizer)
        if fmt is not None and fmt.opens_in(list(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True))):
            opening.append(name)
    # Qwen3.5's, DeepSeek-V3.1's and Nemotron-H's generation prompts end in <think>.
    assert {"qwen3_5", "deepseek_v3", "nemotron_h"} <= set(opening)
    assert "qwen3" not in opening  # Qwen3 lets the model open it


def test_gpt_oss_effort_is_its_templates_reasoning_level():
    from mlx_lm.tokenizer_utils import load

    tokenizer = load(zoo_model("gpt_oss"))
    low = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False, reasoning_effort="low")
    high = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False, reasoning_effort="high")
    assert "Reasoning: low" in low and "Reasoning: high" in high


def test_a_template_that_takes_one_system_message_gets_codexs_several_as_one():
    # Codex sends its instructions, then developer messages: Qwen3.5's template
    # refuses a second system message; mlxd joins the leading ones for it.
    from mlx_lm.tokenizer_utils import load

    from mlxd.engine.prompt import chat_tokens

    several = [{"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use the shell."}, *CHAT]
    joined = [{"role": "system", "content": "Be brief.\n\nUse the shell."}, *CHAT]
    qwen3_5 = load(zoo_model("qwen3_5"))
    with pytest.raises(Exception, match="System message must be at the beginning"):
        qwen3_5.apply_chat_template(several, add_generation_prompt=True)
    assert chat_tokens(qwen3_5, several) == chat_tokens(qwen3_5, joined)


@pytest.mark.parametrize("name", ["gemma3_text", "ministral3"])
def test_consecutive_turns_of_one_role_are_one_turn_on_a_template_that_wants_them_alternating(name):
    # Anthropic combines consecutive user (or assistant) turns into one; Gemma's
    # and Mistral's templates raised "roles must alternate", a 400 for a
    # conversation Anthropic answers.
    from mlx_lm.tokenizer_utils import load

    from mlxd.engine.prompt import chat_tokens

    tokenizer = load(zoo_model(name))
    several = [*CHAT, {"role": "user", "content": "Start with config.yaml."},
               {"role": "assistant", "content": "Reading it."}, {"role": "assistant", "content": "Done."},
               {"role": "user", "content": "And?"}]
    merged = [{"role": "user", "content": CHAT[0]["content"] + "\n\nStart with config.yaml."},
              {"role": "assistant", "content": "Reading it.\n\nDone."}, {"role": "user", "content": "And?"}]
    with pytest.raises(Exception, match="alternate"):
        tokenizer.apply_chat_template(several, add_generation_prompt=True)
    assert chat_tokens(tokenizer, several) == chat_tokens(tokenizer, merged)


def test_a_prefill_ends_the_prompt_inside_the_answer_on_every_family(loaded):
    """A continued assistant message (a prefill), rendered as the API renders
    it (thinking off: the answer has begun): the prompt ends with its text,
    outside any reasoning block, on every family's own template."""
    from mlxd.engine.prompt import chat_tokens

    name, tokenizer = loaded
    messages = [*CHAT, {"role": "assistant", "content": "Here is the report: {"}]
    tokens = chat_tokens(tokenizer, messages, template_kwargs={"enable_thinking": False}, end="continue")
    assert tokenizer.decode(tokens).endswith("Here is the report: {"), (name, tokenizer.decode(tokens)[-80:])
    fmt = reasoning.resolve(tokenizer)
    assert fmt is None or not fmt.opens_in(tokens)


def test_a_prefill_the_template_rewrites_is_the_clients_400():
    """Qwen3's template moves a ``</think>`` and what precedes it out of the
    text: transformers then finds no end of the message to continue from
    (its ValueError), which is what the client sent, not a server error."""
    from mlx_lm.tokenizer_utils import load

    from mlxd.engine.prompt import chat_tokens
    from mlxd.errors import BadRequest

    tokenizer = load(zoo_model("qwen3"))
    messages = [*CHAT, {"role": "assistant", "content": "<think>the options</think>Here is {"}]
    with pytest.raises(BadRequest, match="cannot continue it") as refused:
        chat_tokens(tokenizer, messages, end="continue")
    assert refused.value.param == "messages"
