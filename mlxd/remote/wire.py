"""The OpenAI wire form of a remote request, as pure functions: an engine
request -> the upstream JSON body. The answer is read by ``remote.answer``,
an error answer turned into a typed error by ``remote.refusals``. No I/O
here (``remote.engine`` does the talking), so every translation is a plain
unit test."""

from __future__ import annotations

import json
from typing import Any

from mlxd.engine.types import GenerationRequest, SamplingParams
from mlxd.errors import BadRequest

# Sampling fields outside OpenAI's own set: servers that do not know them
# (OpenAI itself) reject them, so they go out only when they change something.
_EXTENSIONS_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def endpoint(request: GenerationRequest) -> str:
    return "/chat/completions" if request.messages is not None else "/completions"


def request_body(request: GenerationRequest, remote_model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": remote_model,
        "max_tokens": request.max_tokens,
        "stream": True,
        # Usage comes back in the last chunk only when asked for.
        "stream_options": {"include_usage": True},
        **_sampling(request.sampling, request.sampling_set),
    }
    if request.messages is not None:
        body["messages"] = _wire_messages(request.messages, request.images)
    else:
        body["prompt"] = request.prompt or ""
    if request.stop:
        body["stop"] = list(request.stop)
    # The answer's shape, as the client asked for it: the backend applies
    # its own tool-call format and grammar.
    if request.output is not None:
        body.update(request.output.openai_json())
    if request.chat_template_kwargs and request.messages is not None:
        # The template variables (enable_thinking ...): vLLM, mlx_lm.server
        # and mlxd render the backend model's template with them.
        body["chat_template_kwargs"] = request.chat_template_kwargs
    if request.messages is not None and request.prompt_end != "new_turn":
        # vLLM's fields, which mlxd reads too: a backend that went by its
        # own default would answer the prefill afresh instead of going on.
        body["add_generation_prompt"] = False
        if request.prompt_end == "continue":
            body["continue_final_message"] = True
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    if request.reasoning_budget is not None and request.messages is not None:
        body["reasoning"] = {"max_tokens": request.reasoning_budget}  # mlxd and OpenRouter read it
    if request.ignore_eos:
        body["ignore_eos"] = True  # vLLM and mlxd know it; a benchmark setting
    if request.logit_bias:
        # The ids are the backend model's: it checks them against its vocabulary.
        body["logit_bias"] = {str(token): bias for token, bias in request.logit_bias.items()}
    return body


def _sampling(s: SamplingParams, given: frozenset[str]) -> dict[str, Any]:
    """What the request or the entry's defaults said; the backend applies
    its own defaults (an mlxd backend: its model's) to the rest."""
    out: dict[str, Any] = {}
    for name in sorted(given):
        value = getattr(s, name)
        if name in _EXTENSIONS_NEUTRAL and value == _EXTENSIONS_NEUTRAL[name]:
            continue
        if value is not None:
            out[name] = value
    return out


def _wire_messages(messages: list[dict[str, Any]], images: list[Any]) -> list[dict[str, Any]]:
    """Template messages in OpenAI's wire form: each ``{"type": "image"}``
    placeholder becomes the image itself (``images``: data URLs, in message
    order), and tool-call arguments go back to JSON text (templates take
    them as objects, rendered with ``tojson``)."""
    pending = iter(images)
    return [_wire_message(m, pending) for m in messages]


def _wire_message(message: dict[str, Any], images: Any) -> dict[str, Any]:
    out = message
    content = message.get("content")
    if isinstance(content, list) and any(p.get("type") == "image" for p in content):
        parts = [{"type": "image_url", "image_url": {"url": _next_image(images)}} if p.get("type") == "image" else p
                 for p in content]
        out = {**out, "content": parts}
    calls = message.get("tool_calls")
    if calls:
        wired = []
        for call in calls:
            function = dict(call.get("function") or {})
            if not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments"))
            wired.append({**call, "function": function})
        out = {**out, "tool_calls": wired}
    return out


def _next_image(images: Any) -> str:
    url = next(images, None)
    if url is None:  # a placeholder without its image: nothing to send for it
        raise BadRequest("An image part of the conversation has no image data.", param="messages")
    return url
