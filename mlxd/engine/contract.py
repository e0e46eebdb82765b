"""The contract of an engine that generates: what the request path asks of
every engine of a kind that serves chat or completion requests (text,
vision, a remote backend, a gang of ranks, a kind added by one table row).

It is an abstract class rather than a protocol so that an engine lacking a
member fails loudly: a subclass that leaves one out cannot be built
(``TypeError`` naming it), and the daemon's engine factory refuses an engine
of a generating kind that is no ``GenerationEngine`` at all
(``daemon/engines.py``). The request path reads only these members; it
never asks an engine what it is.

The request path's steps, in order, on a held lease:
1. ``prepare(requests, output, name)``: the engine settles what the request
   asks of the answer's shape (tools, tool_choice, response_format) and of
   its tokens (logit_bias, logprobs) on the attempt's own requests, and says
   how to split its answer. A local engine plans the tools and the grammar
   over its tool-call format, checks the bias against its vocabulary and
   compiles the grammar off the event loop; a remote one forwards the fields
   as sent and refuses what its backend cannot relay. What this model cannot
   give is a ``NotForThisModel`` (a failover entry's next target may);
   anything else wrong with the request is a ``BadRequest``.
2. ``generate(request)``: its first chunk is an empty one that says the
   request was accepted (a local engine: its prompt fits; a remote one: the
   backend took it); a stream answers 200 only after it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mlxd.engine.types import GenerationChunk, GenerationRequest, SavedCache
from mlxd.tools.formats import ToolFormat
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.reasoning import ReasoningFormat


@dataclass(frozen=True)
class AnswerFormats:
    """How to split an engine's answer: tool calls out of its text (None:
    the answer is text, or its calls arrive already split) and its reasoning
    from its answer (None: no markers, or a backend that splits it)."""

    tool_format: ToolFormat | None = None
    reasoning_format: ReasoningFormat | None = None


class GenerationEngine(ABC):
    """A loaded model that generates. All of it is abstract: each engine
    says every member itself (a class attribute does for a constant)."""

    name: str

    # --- what the request path asks ---------------------------------------------

    @property
    @abstractmethod
    def batching(self) -> bool:
        """Whether its generations decode side by side in one batch: a
        request's n choices (or prompts) then run at once, else one after
        the other within the lease."""

    @property
    @abstractmethod
    def wants_image_urls(self) -> bool:
        """Whether a request's images go to it as ``data:`` URLs (a backend
        decodes them itself) rather than decoded here."""

    @abstractmethod
    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        """Settle ``output`` and each request's logit_bias and logprobs on
        ``requests`` (one attempt's own copies, which it may rewrite), before
        the first of them is generated; ``name`` is what the client asked
        for, for its messages. Raises ``NotForThisModel`` for what this
        model cannot give, ``BadRequest`` for the rest."""

    @abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream chunks, the first an empty one once the request is
        accepted. Closing the iterator early stops the generation within a
        token or two and frees what it held."""

    # --- what residency and the daemon ask (``engine.types.Engine``) ---------------

    @property
    @abstractmethod
    def measured_bytes(self) -> int | None:
        """The model's real memory cost so far, or None when it cannot say."""

    @abstractmethod
    async def abort_all(self, reason: str) -> int:
        """End every generation in flight with finish_reason "abort"; how many."""

    @abstractmethod
    async def before_unload(self) -> SavedCache | None:
        """Save what outlives the model (its prefix cache); never raises."""

    @abstractmethod
    async def close(self) -> None:
        """Free the model, once every lease is gone."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Cheap figures for /v1/status (never waits on MLX)."""

    @abstractmethod
    async def clear_prefix_cache(self) -> bool:
        """Forget the prefix cache; False when it keeps none."""
