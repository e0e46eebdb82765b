"""Prompt preparation for text models: a request's messages or prompt as token ids.

Pure functions of a tokenizer and a request, with no engine, worker or MLX
in sight (any thread may call them), so the exact tokens a model will see can
be checked from a REPL::

    >>> from mlx_lm import load
    >>> from mlxd.engine.prompt import chat_tokens
    >>> _, tokenizer = load("path/to/model")
    >>> chat_tokens(tokenizer, [{"role": "user", "content": "Hi"}])

Chat messages go through the model's chat template (OpenAI content parts
flattened to one string, tool-call arguments parsed from JSON text, as
mlx-lm's own server does; tools written into the text where the template
has no place for them, ``mlxd.tools.fallback``); a raw prompt is encoded with a BOS token unless it
already starts with one. What a client got wrong is a ``BadRequest``.

A chat prompt ends with the template's generation prompt, or, for a
prefill, inside the last assistant message, cut where its text ends
(transformers' ``continue_final_message``: the template renders the turn
whole, its own way, and the text after the message is dropped), or as the
template renders the conversation (``PromptEnd``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from mlxd.engine.types import GenerationRequest, PromptEnd
from mlxd.errors import BadRequest, ContextTooLong, describe_exception
from mlxd.tools import fallback, thinking_switch


def prompt_tokens(tokenizer: Any, request: GenerationRequest) -> list[int]:
    """The request's prompt as token ids (chat template applied to ``messages``)."""
    if (request.prompt is None) == (request.messages is None):
        raise BadRequest("Give exactly one of `prompt` and `messages`.", param="messages")
    if request.messages is not None:
        return chat_tokens(tokenizer, request.messages, request.tools, request.chat_template_kwargs,
                           end=request.prompt_end)
    return text_tokens(tokenizer, request.prompt or "")


def text_tokens(tokenizer: Any, prompt: str) -> list[int]:
    """A raw completion prompt as token ids. As mlx-lm does: add BOS unless
    the prompt already starts with it."""
    bos = tokenizer.bos_token
    return list(tokenizer.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos)))


def chat_tokens(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None, *, end: PromptEnd = "new_turn",
) -> list[int]:
    """Chat messages (and OpenAI-shaped tool definitions) as token ids: the
    tokenizer's chat template, ending as ``end`` says (the generation prompt
    added by default), and ``template_kwargs`` as the template's variables
    (``enable_thinking``: mlx-lm's wrapper renames it for families whose
    template calls it ``thinking``). Raises ``BadRequest`` when the template
    refuses."""
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers depends on jinja2
        TemplateError = ValueError  # type: ignore[misc,assignment]  # noqa: N806
    if not getattr(tokenizer, "has_chat_template", True):
        raise BadRequest(
            "This model has no chat template; send a raw prompt to /v1/completions instead.",
            param="messages",
        )
    template = getattr(tokenizer, "chat_template", None)
    # A family that turns thinking off by a system line, not the variable (Nemotron-H's /no_think).
    flat = thinking_switch.switched([flatten_message(m) for m in messages], template, template_kwargs)
    if fallback.needs_folding(flat, tools) and not fallback.renders_tools(template):
        # The template would drop them: written into the turns' text instead.
        flat, tools = fallback.fold(flat, tools), None
    try:
        tokens = render(tokenizer, flat, tools, template_kwargs, end=end)
    except ValueError as exc:
        if end != "continue":
            raise
        # transformers' refusal: the template rewrote or dropped the last
        # message's text (a think block stripped, the text trimmed), so there
        # is no place in the prompt where it ends for the answer to go on.
        raise BadRequest(
            "This model's chat template does not render the final assistant message's text as it was sent, so the "
            f"answer cannot continue it; send the conversation without it. ({str(exc).splitlines()[0]})",
            param="messages",
        ) from None
    except TemplateError as exc:
        # Templates raise their own messages ("roles must alternate ..."),
        # written for the person sending the conversation.
        raise BadRequest(f"The chat template rejected the messages: {exc}", param="messages") from exc
    except RecursionError:
        # The API layer bounds nesting; a template that recurses more deeply
        # still must not be a server error for what the client sent.
        raise BadRequest("The conversation nests too deeply for this model's chat template.",
                         param="messages") from None
    except (TypeError, KeyError, IndexError, AttributeError) as exc:
        # A template's filter meeting a value of a shape it does not expect
        # (``items`` of a list): what the client sent, which this template
        # cannot write. The API layer checks the shapes it knows of.
        raise BadRequest(f"The chat template cannot render these messages: {describe_exception(exc)}",
                         param="messages") from None
    return list(tokens)


def render(
    tokenizer: Any, flat: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None, *, end: PromptEnd = "new_turn",
) -> list[int]:
    """The chat template applied to flattened messages, ending as ``end``
    says. A template that refuses what the APIs allow gets it in the form
    it takes, one step more at each refusal (``accommodated``); a template
    that takes the conversation as it is renders it unchanged."""
    from jinja2 import TemplateError

    ending: dict[str, Any] = {"add_generation_prompt": end == "new_turn"}
    if end == "continue":
        ending["continue_final_message"] = True

    def apply(messages: list[dict[str, Any]], listed: list[dict[str, Any]] | None) -> list[int]:
        return list(tokenizer.apply_chat_template(
            messages, tools=listed or None, **ending, **(template_kwargs or {})
        ))

    try:
        return apply(flat, tools)
    except TemplateError as refused:
        error: TemplateError = refused
    for messages, listed in accommodated(flat, tools):
        try:
            return apply(messages, listed)
        except TemplateError as refused:
            error = refused
    # What the template still refuses in the most accommodating form.
    raise error


def accommodated(
    flat: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """The conversation in forms a stricter template takes, each one step
    more than the one before (only the steps that change something):

    - several leading system messages as one (Qwen3.5's "System message must
      be at the beginning", Mistral's and Gemma's role checks; Codex sends its
      instructions, then developer messages), as ``joined_system``;
    - consecutive user (or assistant) messages as one turn, as Anthropic's
      API documents it combines them (Gemma's and Mistral's "roles must
      alternate"), as ``merged_turns``;
    - every tool with a description, empty where the client gave none
      (gpt-oss's template adds ``tool.description`` to a string);
    - an assistant turn with tool calls, text and reasoning without its text
      (gpt-oss's "Cannot pass both content and thinking": the model wrote an
      analysis, a preamble and the call, and the template has room for the
      analysis only; mlxd's own gpt-oss answers come back so)."""
    steps = (
        lambda messages, listed: (joined_system(messages), listed),
        lambda messages, listed: (merged_turns(messages), listed),
        lambda messages, listed: (messages, described(listed)),
        lambda messages, listed: (analysis_only(messages), listed),
    )
    current = (flat, tools)
    for step in steps:
        changed = step(*current)
        if changed[0] is not current[0] or changed[1] is not current[1]:
            current = changed
            yield current


def described(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """``tools`` with an empty description where a function has none (``tools`` itself when all have one)."""
    if not tools or all(_function(t).get("description") is not None for t in tools):
        return tools
    return [t if _function(t).get("description") is not None or not isinstance(t.get("function"), dict)
            else {**t, "function": {**t["function"], "description": ""}} for t in tools]


def _function(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function if isinstance(function, dict) else {}


def analysis_only(flat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``flat`` without the text of assistant tool-call turns that carry
    reasoning too (``flat`` itself when there is none)."""
    def both(m: dict[str, Any]) -> bool:
        return (m.get("role") == "assistant" and bool(m.get("tool_calls")) and bool(m.get("content"))
                and bool(m.get("thinking") or m.get("reasoning_content")))

    if not any(both(m) for m in flat):
        return flat
    return [{**m, "content": ""} if both(m) else m for m in flat]


def joined_system(flat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``flat`` with its leading system messages as one (``flat`` itself when it opens with fewer than two)."""
    lead = 0
    while lead < len(flat) and flat[lead].get("role") == "system":
        lead += 1
    if lead < 2:
        return flat
    text = "\n\n".join(str(m.get("content") or "") for m in flat[:lead])
    return [{"role": "system", "content": text}, *flat[lead:]]


# The roles whose consecutive messages are one turn (a tool message answers one call).
MERGED_ROLES = ("user", "assistant")


def merged_turns(flat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``flat`` with each run of user (or assistant) messages as one message
    (``flat`` itself when no two of one role follow each other)."""
    if not any(_same_turn(a, b) for a, b in zip(flat, flat[1:], strict=False)):
        return flat
    out: list[dict[str, Any]] = []
    for message in flat:
        if out and _same_turn(out[-1], message):
            out[-1] = _merged(out[-1], message)
        else:
            out.append(message)
    return out


def _same_turn(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("role") == b.get("role") and b.get("role") in MERGED_ROLES


def _merged(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    out = {**first, **second}
    a, b = first.get("content") or "", second.get("content") or ""
    if isinstance(a, str) and isinstance(b, str):
        out["content"] = "\n\n".join(t for t in (a, b) if t)
    else:
        out["content"] = [*_parts(a), *_parts(b)]
    calls = [*(first.get("tool_calls") or ()), *(second.get("tool_calls") or ())]
    if calls:
        out["tool_calls"] = calls
    for key in ("reasoning_content", "thinking"):
        joined = "\n\n".join(t for t in (first.get(key), second.get(key)) if t)
        if joined:
            out[key] = joined
    return out


def _parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if content else []


def flatten_message(message: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAI message with its content as one string (as mlx-lm's server does)."""
    if not isinstance(message, dict):
        raise BadRequest("Each message must be an object.", param="messages")
    flat = dict(message)
    content = flat.get("content")
    if content is None:
        flat["content"] = ""
    elif isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"This is a text model; message content of type `{kind}` is not supported.",
                    param="messages",
                )
            texts.append(str(part.get("text", "")))
        flat["content"] = "".join(texts)
    elif not isinstance(content, str):
        raise BadRequest("Message content must be a string or a list of parts.", param="messages")
    tool_calls = flat.get("tool_calls")
    if tool_calls:
        # Chat templates expect tool arguments as objects, the API sends JSON text.
        calls = []
        for call in tool_calls:
            call = dict(call)
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise BadRequest(
                        "tool_calls[].function.arguments is not valid JSON.", param="messages"
                    ) from exc
            call["function"] = function
            calls.append(call)
        flat["tool_calls"] = calls
    return flat


def check_context(n_prompt: int, request: GenerationRequest, limit: int) -> None:
    """Refuse an empty prompt, or one longer than the model's context, with a
    400 naming the field it came in."""
    param = "messages" if request.messages is not None else "prompt"
    if n_prompt == 0:
        raise BadRequest("The prompt is empty.", param=param)
    if n_prompt > limit:
        raise ContextTooLong(
            f"This model's maximum context length is {limit} tokens, but the "
            f"prompt has {n_prompt} tokens. Shorten the {param}.",
            param=param, prompt_tokens=n_prompt, limit=limit,
        )


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
