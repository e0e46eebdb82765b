"""An answer that goes on from the conversation's last assistant message:
Anthropic's prefill (a final ``assistant`` message), vLLM's
``continue_final_message`` on chat. The prompt ends inside that message
(``mlxd.engine.prompt``) and the answer is only what the model adds.

What such an answer rules out and what it implies, whatever the surface:

- thinking: the answer has begun, so no reasoning comes before it. A request
  that asks for thinking is refused, as Anthropic refuses a prefill with
  extended thinking; one that says nothing renders with thinking off (a
  template that would think writes the prefill after an empty or no think
  block, not inside an open one);
- a grammar over the whole answer (structured output, a forced tool call):
  it would constrain the continuation as if it were the whole answer, which
  the prefill has already begun, so the combination is refused.
"""

from __future__ import annotations

from dataclasses import replace

from mlxd.api.reasoning import ReasoningRequest
from mlxd.engine.types import PromptEnd
from mlxd.errors import BadRequest
from mlxd.tools.output_plan import whole_answer_grammar
from mlxd.tools.output_request import OutputRequest


def settled(end: PromptEnd, reasoning: ReasoningRequest, output: OutputRequest) -> ReasoningRequest:
    """``reasoning`` as an answer whose prompt ends at ``end`` renders with
    it (a continued one: thinking off); a BadRequest for what cannot
    continue a message."""
    if end != "continue":
        return reasoning
    if reasoning.enabled:
        raise BadRequest(
            "The conversation ends with an assistant message for the answer to continue (a prefill), and an answer "
            "that has begun cannot think first: turn thinking off, or leave the assistant message out.",
            param="messages",
        )
    param = whole_answer_grammar(output)
    if param is not None:
        raise BadRequest(
            f"`{param}` constrains the whole answer, but the conversation ends with an assistant message that has "
            "already begun it (a prefill): send one or the other.",
            param=param,
        )
    return replace(reasoning, enabled=False)
