"""Turning thinking off the family's own way where its template reads no
variable for it. Nemotron-H's template (and the others written like it)
looks for ``/no_think`` in the system and user turns and ignores
``enable_thinking``: a request that says ``enable_thinking: false``
(``reasoning_effort: none``, ``reasoning.enabled: false``, Anthropic's
``thinking: disabled``, the registry's default) gets the flag written into
its system turn, which such a template strips from what it renders. The
conversation's own words still win: a later ``/think`` turns it back on."""

from __future__ import annotations

import re
from typing import Any

OFF_FLAG = "/no_think"
# The template reads the variable itself: a namespace attribute
# (``ns.enable_thinking``) or a keyword (``namespace(enable_thinking=...)``) is not it.
_READS_VARIABLE = re.compile(r"(?<![.\w])enable_thinking\b(?!\s*=[^=])")


def off_flag(template: Any) -> str | None:
    """The system-turn flag that turns ``template``'s thinking off, or None
    when the template takes ``enable_thinking`` (or knows no such flag)."""
    if not isinstance(template, str) or f"'{OFF_FLAG}'" not in template and f'"{OFF_FLAG}"' not in template:
        return None
    return None if _READS_VARIABLE.search(template) else OFF_FLAG


def switched(messages: list[dict[str, Any]], template: Any, template_kwargs: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``messages`` (content already one string each) with the off flag in
    the system turn when the request turns thinking off and ``template``
    reads the flag rather than the variable."""
    if (template_kwargs or {}).get("enable_thinking") is not False:
        return messages
    flag = off_flag(template)
    if flag is None:
        return messages
    if messages and messages[0].get("role") == "system":
        system = dict(messages[0])
        system["content"] = f"{system.get('content') or ''}\n{flag}"
        return [system, *messages[1:]]
    return [{"role": "system", "content": flag}, *messages]
