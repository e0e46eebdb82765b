"""Between-turn prefill ("next turn"): what of the next prompt is known when
an answer ends, and whether to prefill it.

Some chat templates write part of the prompt at a place that moves with each
new user turn: Mistral Small 3.1's writes the tool list right before the
*last* user message. The next prompt then shares with this one only the
tokens before the old tool list, and no exact prefix cache can reuse more
(docs/prefix-cache.md, "Where exact reuse stops"). But when an answer ends,
most of the next prompt is known: the history, this answer and whatever the
template writes before the next user message. So the conversation is
rendered with the answer appended and a user message holding a sentinel,
the rendering is cut where the sentinel begins, and that prefix is prefilled
in the background (``engine/next_turn_background.py``) and kept as a prefix
cache entry: the next request finds a long exact prefix.

The cut: the conversation is rendered twice with two sentinels that differ
from their first character; the tokens both renderings share end where the
sentinel begins (a token that merges the text before the sentinel with its
first character is left out, so the cut is always a prefix of the real next
prompt's tokens, whatever its user message says).

Pure functions of a tokenizer (no MLX, any thread): ``probe_loss`` decides
``auto`` once per model, ``next_prompt`` and ``gain`` decide per answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxd.engine.prompt import chat_tokens, common_prefix, flatten_message, prompt_tokens
from mlxd.engine.types import GenerationRequest

# The registry's values (``prefix_cache.next_turn``).
AUTO = "auto"
SETTINGS = (AUTO, True, False)

# Two user messages no conversation holds, told apart by their first
# character, which is one byte: byte-level tokenizers share the leading bytes
# of two multi-byte characters, which no real next message has.
SENTINELS = ("Xq7 mlxd next turn 7c1f", "Jk4 mlxd next turn 7c1f")

# Under ``auto``, prefill between turns only when the next turn's rendering
# gives up at least this many tokens of the prompt before it (a template that
# drops a think block it opened loses a few tokens: not worth a prefill).
MIN_LOST = 64

# A template may render the prompt apart when the next user message repeats
# an earlier one (Mistral's writes the tool list before every user message
# equal to the last): the next prompt for this many of the most recent
# distinct user messages, repeated, is prefilled too where it differs.
MAX_REPEATS = 2
# ... when it costs at most this many times the new message's own prefill.
REPEAT_COST = 2

# The probe ``auto`` renders once per model: a short conversation with tools.
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project and return its text.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
_PROBE = [{"role": "system", "content": "You are a careful coding agent."},
          {"role": "user", "content": "Read the configuration file and report the options."}]
_PROBE_ANSWER = "The configuration file sets the port and the model folder."


@dataclass(frozen=True)
class Answer:
    """What the client will send back of an answer (its reasoning dropped, as
    chat clients and templates do): its text and its tool calls."""

    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [dict(c) for c in self.tool_calls]
        return out


def answered(request: GenerationRequest, answer: Answer) -> list[dict[str, Any]]:
    """The conversation with ``answer`` as the client sends it back: a new
    assistant message, or, where the answer continued the last one (a
    prefill), that message with the answer's text after its own."""
    messages = list(request.messages or [])
    if request.prompt_end != "continue" or not messages:
        return [*messages, answer.message()]
    prefill = flatten_message(messages[-1])
    return [*messages[:-1], {**prefill, **answer.message(), "content": prefill["content"] + answer.content}]


def skip_reason(request: GenerationRequest, finish_reason: str | None, *, setting: Any,
                cache_on: bool) -> str | None:
    """Why an answer gets no between-turn prefill (None: it may get one).
    Only a chat answer that ended by itself or at its length can be the
    history of a next turn; one of n choices, a warm-up or a cancelled or
    failed answer is not."""
    if setting is False:
        return "off"
    if not cache_on:
        return "no prefix cache"
    if request.warmup:
        return "warm-up"
    if request.messages is None:
        return "not a chat"
    if request.choices > 1:
        return "one of several choices"
    if request.prompt_end == "as_is":
        return "no new turn"  # (its answer is not known to be an assistant message)
    if finish_reason not in ("stop", "length"):
        return "did not finish"
    return None


def wanted(setting: Any, lost: int | None) -> bool:
    """Whether the model prefills between turns at all: ``true``/``false`` as
    set; ``auto`` when its template's next turn gives up at least
    ``MIN_LOST`` tokens of the prompt before it (``probe_loss``; None: the
    probe could not render)."""
    if setting is True or setting is False:
        return setting
    return lost is not None and lost >= MIN_LOST


def worth(setting: Any, prompt: Sequence[int], following: Sequence[int]) -> bool:
    """Per answer: whether prefilling ``following`` (the next prompt's known
    part) gains anything. Under ``auto`` it must move the prompt by at least
    ``MIN_LOST`` tokens (a request without tools, on Mistral, moves nothing);
    under ``true`` it must go beyond the prompt's own prefix (the answer's
    entry holds that one)."""
    shared = common_prefix(prompt, following)
    return len(prompt) - shared >= MIN_LOST if setting == AUTO else shared < len(following)


def next_prompt(tokenizer: Any, request: GenerationRequest, answer: Answer) -> list[int]:
    """The tokens the next request of this conversation starts with: the
    conversation, ``answer`` and what the template writes before the next
    user message, rendered as a request's prompt is (``chat_tokens``).
    Raises what the template raises."""
    messages = answered(request, answer)
    renderings = [chat_tokens(tokenizer, [*messages, {"role": "user", "content": sentinel}], request.tools,
                              request.chat_template_kwargs) for sentinel in SENTINELS]
    return renderings[0][: common_prefix(*renderings)]


def repeated_prompt(tokenizer: Any, request: GenerationRequest, answer: Answer, following: Sequence[int],
                    text: str) -> list[int] | None:
    """The whole next prompt if its user message repeats ``text`` (one of
    ``recent_user_texts``), when its rendering gives up part of
    ``following`` (the new message's known part); None on a template that
    renders a repeat as any other message."""
    messages = [*answered(request, answer), {"role": "user", "content": text}]
    tokens = chat_tokens(tokenizer, messages, request.tools, request.chat_template_kwargs)
    return tokens if len(following) - common_prefix(following, tokens) >= MIN_LOST else None


def recent_user_texts(messages: Sequence[dict[str, Any]], limit: int) -> list[str]:
    """The last ``limit`` distinct texts of user messages, most recent first
    (only messages whose content is a string)."""
    out: list[str] = []
    for m in reversed(messages):
        text = m.get("content") if isinstance(m, dict) and m.get("role") == "user" else None
        if isinstance(text, str) and text not in out:
            out.append(text)
            if len(out) == limit:
                break
    return out


def probe_loss(tokenizer: Any) -> int | None:
    """How many tokens of a prompt the next turn's rendering gives up (the
    tokens after the first that differs), on a short conversation with tools;
    None when the template refuses it."""
    request = GenerationRequest(request_id="next-turn-probe", max_tokens=1, messages=list(_PROBE),
                                tools=list(_PROBE_TOOLS))
    try:
        prompt = prompt_tokens(tokenizer, request)
        following = next_prompt(tokenizer, request, Answer(_PROBE_ANSWER))
    except Exception:  # noqa: BLE001 - a template that refuses the probe gets no prefill
        return None
    return len(prompt) - common_prefix(prompt, following)
