"""How an engine that decodes here (text, vision, a gang whose rank 0
samples) settles a request's output in ``prepare``: the tools its template
renders and the grammar, planned over its model's tool-call format; the
logit_bias checked against its vocabulary (the engine checks it again, but
a stream's bad id must be a 400 before its 200); the grammar compiled off
the event loop (kept in the model's grammar cache), so that a schema that
does not compile is a 400 before a stream's 200 rather than an error frame
inside it.

A forced call is the grammar's whole answer: a stop string meant for prose
(``"``, ``}``, a newline) would cut it inside its JSON, so stop strings do
not apply to it, on every surface.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from mlxd.engine.contract import AnswerFormats
from mlxd.engine.sampling import check_bias_ids
from mlxd.engine.types import GenerationRequest
from mlxd.errors import BadRequest, NotForThisModel
from mlxd.grammar.compiler import GrammarCompiler
from mlxd.tools.formats import ToolFormat
from mlxd.tools.output_plan import plan_output
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.reasoning import ReasoningFormat


def shape_locally(
    requests: list[GenerationRequest], output: OutputRequest, name: str, tool_format: ToolFormat | None, *,
    reasoning_format: ReasoningFormat | None = None, vocab_size: int | None = None,
) -> AnswerFormats:
    """The pure part: ``requests`` given the template's tools and the
    grammar, stop strings dropped for a forced call. The request's shape was
    checked before the lease, so what is left to refuse is this model's own
    lack (no tool-call format, a token id past its vocabulary), which
    another model may not have: a ``NotForThisModel``."""
    try:
        for request in requests:
            if request.logit_bias and vocab_size is not None:
                check_bias_ids(request.logit_bias, vocab_size)
        if not output.asks_anything():
            return AnswerFormats(reasoning_format=reasoning_format)
        shaped = plan_output(name, tool_format, output)
    except BadRequest as exc:
        raise NotForThisModel.of(exc) from None
    for request in requests:
        request.tools = shaped.tools
        request.callable_tools = shaped.callable_tools
        request.constraint = shaped.constraint
        if shaped.forces_call:
            request.stop = []
    return AnswerFormats(shaped.tool_format, reasoning_format)


@dataclass(frozen=True)
class LocalOutput:
    """One loaded model's means of settling output: its tool-call format,
    its reasoning markers, its grammar compiler and its vocabulary size."""

    tool_format: ToolFormat | None
    reasoning_format: ReasoningFormat | None
    grammars: GrammarCompiler
    vocab_size: int

    async def settle(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        formats = shape_locally(requests, output, name, self.tool_format, reasoning_format=self.reasoning_format,
                                vocab_size=self.vocab_size)
        constraint = requests[0].constraint if requests else None
        if constraint is not None:
            # Compiling releases the GIL; a bad schema raises BadRequest here.
            await asyncio.to_thread(self.grammars.matcher, constraint)
        return formats
