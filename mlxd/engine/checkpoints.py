"""Where to checkpoint a cache that cannot be trimmed.

A sliding-window cache that has wrapped, or the state of a linear-attention
or SSM layer, cannot be cut back to an earlier position: the prefix cache can
only reuse such a cache for exactly the tokens it was saved at. So while a
request's prompt is prefilled, its cache is copied at the positions where
the *next* request is likely to continue:

- ``system``: the end of the system prompt (and tools), found as mlx-lm's
  server finds it, by rendering the system messages before an empty user
  turn. New conversations and an agent's side requests start there;
- ``prompt``: where the next turn, as the chat template renders it (this
  conversation, an answer and a new user message), leaves this prompt. For
  most templates that is the end of the prompt (the next turn repeats it and
  adds the answer); a template whose generation prompt opens a think block
  that it drops from past answers (Qwen3.5, Nemotron-H) diverges a few
  tokens earlier, and the checkpoint goes there instead of the prompt's end;
- the end of the prompt, for a completion prompt or a template the probe
  cannot render.

The reply's own end is kept too when the generation finishes (as for every
model). Boundaries are computed on the tokenizing thread from the tokenizer
alone (no MLX); ``plan`` is pure.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxd.engine.prompt import chat_tokens, common_prefix, flatten_message
from mlxd.engine.types import GenerationRequest

log = logging.getLogger(__name__)

# The next turn appended to find where its rendering leaves the prompt; any
# short text does.
_NEXT_TURN = ({"role": "assistant", "content": "OK."}, {"role": "user", "content": "OK?"})


@dataclass(frozen=True)
class Boundary:
    position: int
    kind: str  # "system" or "prompt"


def boundaries(tokenizer: Any, request: GenerationRequest, tokens: Sequence[int]) -> list[Boundary]:
    """Where a conversation's next request will likely share ``tokens`` up to."""
    end = Boundary(len(tokens), "prompt")
    messages = request.messages
    if not messages or not getattr(tokenizer, "has_chat_template", True):
        return [end]
    out = []
    try:
        flat = [flatten_message(m) for m in messages]
        shared = common_prefix(_render(tokenizer, [*flat, *_NEXT_TURN], request), tokens)
        out.append(Boundary(shared, "prompt") if 0 < shared < len(tokens) else end)
        system = _leading_system(flat)
        if system and len(system) < len(flat):
            rendered = _render(tokenizer, [*system, {"role": "user", "content": ""}], request)
            shared = common_prefix(rendered, tokens)
            if 0 < shared < len(tokens):
                out.append(Boundary(shared, "system"))
    except Exception as exc:  # noqa: BLE001 - a template that refuses the probe only costs reuse
        log.debug("no message boundaries for this prompt: %s", exc)
    return out or [end]


def plan(boundaries: Sequence[Boundary], n_prompt: int, keep: int, reused: int) -> list[Boundary]:
    """The checkpoints to take while prefilling: positions after the reused
    prefix and before the tokens left for decoding (``keep``), in order, one
    per position (a system boundary wins: it is never superseded)."""
    last = n_prompt - max(1, keep)
    chosen: dict[int, Boundary] = {}
    for b in boundaries:
        position = min(b.position, last)
        if position <= reused or position <= 0:
            continue
        if position not in chosen or b.kind == "system":
            chosen[position] = Boundary(position, b.kind)
    return [chosen[p] for p in sorted(chosen)]


def checkpoint(prefix: Any, tokens: Sequence[int], cache: list[Any], kind: str, model: str, since: int) -> None:
    """Keep a copy of ``cache``, which holds exactly ``tokens``, unless an
    entry for them is kept already or the cache was cleared after ``since``
    (``PrefixCache.keep``; worker thread; never raises)."""
    if not prefix.holds(tokens):
        prefix.keep(tokens, cache, model, kind, since=since)


def _leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        if m.get("role") not in ("system", "developer"):
            break
        out.append(m)
    return out


def _render(tokenizer: Any, messages: list[dict[str, Any]], request: GenerationRequest) -> list[int]:
    # As the request's own prompt is rendered (its template variables, tools
    # written into the text where the template has no place for them): a
    # probe rendered otherwise diverged from the prompt at the tools.
    return chat_tokens(tokenizer, messages, request.tools, request.chat_template_kwargs)
