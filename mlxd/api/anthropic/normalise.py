"""What changes on every request without changing the conversation, taken
out before the chat template sees it, so consecutive turns share their
prefix and the prefix cache can serve it.

Claude Code starts its system prompt with a billing line,
``x-anthropic-billing-header: cc_version=2.1.197.3fa; cc_entrypoint=cli; ...``,
whose value changes from turn to turn. At the head of the prompt it made
every turn a cold prefill (bench/agent_turns.py measures it); the line is
metadata for Anthropic's billing, nothing a local model needs.
"""

from __future__ import annotations

BILLING_HEADER = "x-anthropic-billing-header:"


def without_billing_header(text: str) -> str:
    """``text`` without leading billing-header lines (and the blank line after)."""
    lines = text.split("\n")
    dropped = 0
    while dropped < len(lines) and lines[dropped].lstrip().lower().startswith(BILLING_HEADER):
        dropped += 1
    if dropped == 0:
        return text
    rest = lines[dropped:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    return "\n".join(rest)
