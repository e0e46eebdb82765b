"""The engine contract: what the HTTP layer hands an engine and gets back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from mlxd.tools.output_request import OutputRequest


# How a chat prompt ends (vLLM's ``add_generation_prompt`` and
# ``continue_final_message``): "new_turn", the template's generation prompt,
# a new assistant turn; "continue", inside the last message, an assistant's
# text the answer goes on from (a prefill: the answer is the continuation);
# "as_is", the conversation as the template renders it, nothing added.
PromptEnd = Literal["new_turn", "continue", "as_is"]


@dataclass(frozen=True)
class SamplingParams:
    """Fully resolved sampling: request > model defaults > fallbacks."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class Constraint:
    """Decode only what a grammar allows (``mlxd.grammar``).

    ``kind`` is "json_schema" (``text`` is the schema as JSON text) or "lark"
    (``text`` is a Lark grammar, ``%json {...}`` allowed inside). Frozen and
    made of text so that it is the key of the per-model grammar cache (key
    order is kept: it is the order the model writes the properties in).
    """

    kind: str
    text: str
    # The request field it came from, as the client's surface spells it
    # (``text.format``), for a grammar that does not compile; not part of
    # the cache key: the same grammar from two surfaces is one.
    param: str | None = field(default=None, compare=False)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool, *, param: str | None = None) -> Constraint:
        import json

        return cls("json_schema", json.dumps(schema, separators=(",", ":")), param)

    @classmethod
    def json_object(cls, *, param: str | None = None) -> Constraint:
        """Any JSON object (OpenAI's ``response_format: json_object``)."""
        return cls.json_schema({"type": "object"}, param=param)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("lark", grammar)


class PromptCapture(Protocol):
    """Where an engine reports what it saw of a captured request (opt-in,
    ``mlxd/api/capture.py``): the prompt as the model saw it, templated,
    and its prefix-cache decision (``engine/cache_explain.py``)."""

    def prompt(self, text: str, tokens: int, decision: dict[str, Any] | None) -> None: ...


@dataclass
class GenerationRequest:
    request_id: str
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # The sampling fields the request or the model's defaults set; the others
    # are fallbacks, which a remote engine leaves to the backend's own defaults.
    sampling_set: frozenset[str] = frozenset()
    stop: list[str] = field(default_factory=list)
    # Exactly one of ``prompt`` (completions) and ``messages`` (chat) is set.
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    # Where the chat prompt ends (``PromptEnd``).
    prompt_end: PromptEnd = "new_turn"
    # Vision: decoded images (PIL) in message order.
    images: list[Any] = field(default_factory=list)
    # Decode to max_tokens even past the end-of-sequence token (benchmarks, tests).
    ignore_eos: bool = False
    # OpenAI-shaped tool definitions, rendered by the chat template.
    tools: list[dict[str, Any]] | None = None
    # The tools the answer's calls are parsed against, where they are more
    # than ``tools`` (deferred ones, ``ToolSpec.listed``); None: ``tools``.
    callable_tools: list[dict[str, Any]] | None = None
    # Constrained decoding (structured output, forced tool calls).
    constraint: Constraint | None = None
    # What the request asked of the answer's shape, for a remote engine to
    # forward (``OutputRequest.openai_json``: the backend enforces it with
    # its own grammar); a local engine is given ``tools`` and ``constraint``.
    output: OutputRequest | None = None
    # Per-token log-probabilities with this many alternatives (None: none).
    logprobs: int | None = None
    # OpenAI's ``logit_bias``: token id -> bias in [-100, 100] added to its
    # logit at every step (None: no bias). Ids are checked against the
    # engine's vocabulary there.
    logit_bias: dict[int, float] | None = None
    # Extra variables for the chat template (``enable_thinking: false``,
    # ``reasoning_effort``): the model's registry defaults under the request's.
    chat_template_kwargs: dict[str, Any] | None = None
    # At most this many tokens of reasoning, then the reasoning's end marker
    # is forced and the answer follows (None: no limit).
    reasoning_budget: int | None = None
    # What the client asked of reasoning, for a remote backend to apply:
    # OpenAI's ``reasoning_effort``.
    reasoning_effort: str | None = None
    # Set only when the request is captured (off by default).
    capture: PromptCapture | None = None
    # The caller's priority class (docs/apps.md, Priority): a batching engine
    # prefills an interactive request's prompt before queued bulk prompts.
    priority: str = "default"
    # The engine's own warm-up request (``mlxd.engine.warmup``): it neither
    # reads nor fills the prefix cache, is not counted in the engine's
    # figures and gives way to any user request. Never set from a client.
    warmup: bool = False
    # How many answers the client asked for this prompt (OpenAI's ``n``):
    # one of several is not known to be the one a conversation goes on with,
    # so none gets a between-turn prefill (``mlxd.engine.next_turn``).
    choices: int = 1

    def tools_to_parse(self) -> list[dict[str, Any]] | None:
        """What the answer's calls are parsed against."""
        return self.callable_tools if self.callable_tools is not None else self.tools


@dataclass(frozen=True)
class ToolCallFragment:
    """A piece of a tool call that arrives already split from the text (a
    remote backend's ``tool_calls`` delta): the first piece of a call names
    it, later ones add argument text. ``index`` counts calls in one answer."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class GenerationChunk:
    """One step of output. ``text`` is the new text since the last chunk.

    The last chunk of a generation has ``finish_reason`` set ("stop",
    "length", or "abort" when the generation was preempted or cancelled);
    when one of the request's stop strings ended it, ``stop_sequence`` is
    that string.
    """

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Prompt tokens served from the prefix cache instead of prefilled.
    cached_tokens: int = 0
    # With ``request.logprobs``: the tokens decoded since the last chunk
    # (``mlxd.engine.logprobs.TokenLogprob``), end-of-sequence left out.
    logprobs: list[Any] | None = None
    stop_sequence: str | None = None
    # Tool calls the engine received as such (remote backends); a local
    # engine's calls are in its text, for the tool-call splitter.
    tool_calls: list[ToolCallFragment] | None = None
    # Reasoning the engine received as such (a backend's reasoning_content);
    # a local engine's is in its text, for the reasoning splitter.
    reasoning: str = ""
    # On the last chunk: how many of the completion tokens were reasoning,
    # as the engine (or a backend) counted them token by token (None: not
    # counted there; the reasoning splitter then counts by chunk).
    reasoning_tokens: int | None = None
    # On the first chunk of a local chat generation: the prompt ended inside
    # a reasoning block the chat template opened (``<think>``), so the text
    # starts as reasoning.
    opens_reasoning: bool = False


@dataclass(frozen=True)
class SavedCache:
    """Where an engine's ``before_unload`` saved what outlives it: its prefix
    cache's folder ``root/fingerprint`` (the daemon then bounds ``root``)."""

    root: Path
    fingerprint: str


class Engine(Protocol):
    """A loaded model. All MLX work runs on the shared worker thread.

    Everything residency and the daemon ask of an engine is here, so a new
    kind (a remote backend) cannot silently lack a footprint or a cache save.
    An engine of a kind that generates also implements what the request
    path asks (``engine/contract.py``, ``GenerationEngine``).
    """

    name: str
    kind: str

    @property
    def measured_bytes(self) -> int | None:
        """The model's real memory cost so far (its load, raised to the first
        generation's peak), or None when the engine cannot say."""
        ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream chunks. Closing the iterator early stops generation within a
        token or two and frees the request's resources. A generation engine
        yields an empty chunk first, once the request is accepted (a local
        one: its prompt fits; a remote one: the backend took it); a stream
        answers 200 only after it."""
        ...

    async def abort_all(self, reason: str) -> int:
        """End every in-flight generation with finish_reason "abort" (used by
        preemption and forced shutdown). Returns how many were aborted."""
        ...

    async def before_unload(self) -> SavedCache | None:
        """Save what should outlive the model (the prefix cache), once no lease
        is left and before ``close``. Returns where it went, or None when
        nothing was saved. Never raises."""
        ...

    async def close(self) -> None:
        """Free the model's memory. Called once, after every lease is gone."""
        ...

    def stats(self) -> dict[str, Any]:
        """Cheap, non-blocking figures for /v1/status (never waits on MLX)."""
        ...

    async def clear_prefix_cache(self) -> bool:
        """Forget the in-memory prefix cache (``DELETE /v1/cache/prefix``).
        False when the engine keeps none."""
        ...


@runtime_checkable
class FailsWhole(Protocol):
    """An engine that can break while resident, under its leases (a gang of
    ranks, one of which died or stalled). Residency waits on ``failure`` for
    as long as the engine is loaded and then takes the model down whole."""

    async def failure(self) -> str:
        """Returns, once the engine has broken, why (which rank, and how)."""
        ...
