"""What a request asks of a thinking model's reasoning, in one shape for
every surface (docs/thinking.md): chat's ``reasoning_effort`` and
``reasoning``, Anthropic's ``thinking`` and ``output_config.effort``, the
Responses API's ``reasoning``, and ``chat_template_kwargs`` on each.

They all end as chat-template variables (``enable_thinking``, which
mlx-lm's tokenizer wrapper renames for families that call it ``thinking``;
``reasoning_effort``, which gpt-oss's template reads) over the model's
registry defaults, and a reasoning budget the engine enforces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxd.errors import BadRequest
from mlxd.registry.model import ModelSpec
from mlxd.tools.reasoning import reserved_template_keys

# Efforts as the templates that read one take them (gpt-oss: low, medium, high).
EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
# The efforts that turn reasoning off instead.
OFF = ("none",)


@dataclass(frozen=True)
class ReasoningRequest:
    # False: no reasoning (the family's no-think prompt); None: the model's default.
    enabled: bool | None = None
    # "low", "medium" or "high" (None: the model's default).
    effort: str | None = None
    # At most this many reasoning tokens, then the answer (None: no limit).
    budget: int | None = None
    # The request's own chat_template_kwargs, over everything else.
    template_kwargs: dict[str, Any] | None = None
    # What the client asked for the effort, as it said it (a remote backend gets it).
    asked_effort: str | None = None
    # The model still reasons, but the answer carries none of it (OpenRouter's
    # ``reasoning.exclude``, its older ``include_reasoning: false``); usage still counts it.
    exclude: bool = False
    # The answer says that the model reasoned but not what: Anthropic's
    # ``thinking.display: "omitted"``, an empty ``thinking`` block (its surface renders it).
    omitted: bool = False

    def asks_anything(self) -> bool:
        return (self.enabled is not None or self.effort is not None or self.budget is not None
                or bool(self.template_kwargs))


def effort(value: Any, param: str) -> ReasoningRequest:
    """A surface's effort word as a request: ``none`` turns reasoning off."""
    if value is None:
        return ReasoningRequest()
    if value in OFF:
        return ReasoningRequest(enabled=False, asked_effort=value)
    if value not in EFFORTS:
        raise BadRequest(
            f"{param} must be one of {', '.join([*OFF, *EFFORTS])}, not {value!r}.", param=param
        )
    return ReasoningRequest(effort=EFFORTS[value], asked_effort=value)


def reasoning_object(value: dict[str, Any] | None, param: str) -> ReasoningRequest:
    """OpenRouter's (and the Responses API's) ``reasoning``: ``effort``,
    ``max_tokens`` (a reasoning budget), ``enabled``, ``exclude`` (reason,
    but leave it out of the answer); ``summary`` changes nothing here."""
    if value is None:
        return ReasoningRequest()
    budget = value.get("max_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise BadRequest(f"{param}.max_tokens must be a whole number of tokens, 0 or more.", param=param)
    enabled = value.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise BadRequest(f"{param}.enabled must be true or false.", param=param)
    asked = effort(value.get("effort"), f"{param}.effort")
    return combine(asked, ReasoningRequest(enabled=enabled, budget=budget,
                                           exclude=_flag(value.get("exclude"), f"{param}.exclude")))


def included(value: Any, param: str = "include_reasoning") -> ReasoningRequest:
    """OpenRouter's older ``include_reasoning``: false is ``reasoning.exclude``."""
    return ReasoningRequest(exclude=_flag(value, param) is False) if value is not None else ReasoningRequest()


def _flag(value: Any, param: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{param} must be true or false.", param=param)
    return value


def template_kwargs(value: Any, param: str = "chat_template_kwargs") -> dict[str, Any] | None:
    """A request's ``chat_template_kwargs``, checked: an object whose names
    are template variables, not apply_chat_template's own arguments."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"{param} must be an object of template variables.", param=param)
    taken = sorted(set(value) & reserved_template_keys())
    if taken:
        raise BadRequest(
            f"{param}.{taken[0]} is an argument of the chat template call, not a template variable; "
            "send it in its own field.",
            param=param,
        )
    return dict(value)


def combine(*asked: ReasoningRequest) -> ReasoningRequest:
    """Several fields of one request: later ones say more specifically."""
    enabled = effort_value = budget = kwargs = raw = None
    exclude = any(a.exclude for a in asked)
    omitted = any(a.omitted for a in asked)
    for a in asked:
        enabled = a.enabled if a.enabled is not None else enabled
        effort_value = a.effort if a.effort is not None else effort_value
        budget = a.budget if a.budget is not None else budget
        raw = a.asked_effort if a.asked_effort is not None else raw
        if a.template_kwargs:
            kwargs = {**(kwargs or {}), **a.template_kwargs}
    return ReasoningRequest(enabled, effort_value, budget, kwargs, raw, exclude, omitted)


def merged_template_kwargs(spec: ModelSpec, asked: ReasoningRequest) -> dict[str, Any] | None:
    """The template variables a request renders with on ``spec``: the
    registry's ``chat_template_kwargs:``, then what the request's reasoning
    fields mean, then its own ``chat_template_kwargs``."""
    merged = spec.template_defaults()
    if asked.enabled is not None:
        merged["enable_thinking"] = asked.enabled
    if asked.effort is not None:
        merged["reasoning_effort"] = asked.effort
    merged.update(asked.template_kwargs or {})
    return merged or None
