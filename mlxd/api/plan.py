"""Everything decided before a lease is taken, for any API surface: which
model, the fully resolved sampling and token limit, the engine requests, the
images to read and the request's deadline."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from mlxd.api.conversation import Conversation
from mlxd.api.images import ImagePolicy, PendingImages, collect_images
from mlxd.engine.types import GenerationRequest, SamplingParams
from mlxd.errors import BadRequest
from mlxd.registry.model import ModelSpec, SamplingDefaults
from mlxd.tools.formats import ToolFormat
from mlxd.tools.plan import check_output, plan_output

if TYPE_CHECKING:
    from mlxd.api.context import DaemonContext

# Fallbacks when neither the request nor the model's defaults say.
FALLBACK = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                          frequency_penalty=0.0)


@dataclass(frozen=True)
class OutputRequest:
    """What a request asks of the answer's shape, in OpenAI chat's terms
    (``tools`` as ``{"type": "function", "function": {...}}``, ``tool_choice``
    "auto" / "required" / "none" / a named function, ``response_format``):
    every surface maps its own fields onto these, and ``mlxd.tools.plan``
    checks them against the model's tool-call format once a lease is held."""

    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def asks_anything(self) -> bool:
        return bool(self.tools) or self.tool_choice is not None or self.response_format is not None


@dataclass(frozen=True)
class Requested:
    """A surface's request in the terms the shared path plans with."""

    model: str
    # What the request says about sampling and max_tokens, in the shape of a
    # model's defaults: None leaves a value to them, then to FALLBACK.
    sampling: SamplingDefaults = field(default_factory=SamplingDefaults)
    stop: tuple[str, ...] = ()
    stream: bool = False
    # Total seconds for this request, queueing and loading included.
    timeout: float | None = None
    ignore_eos: bool = False
    output: OutputRequest = field(default_factory=OutputRequest)


@dataclass
class Plan:
    kind: str  # what the request log calls it: "chat" | "completion" | ...
    spec: ModelSpec
    requested_name: str
    requests: list[GenerationRequest]
    stream: bool
    timeout: float
    started: float = field(default_factory=time.monotonic)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # Vision chat: images checked against the model's rules, read before the lease.
    images: PendingImages | None = None
    output: OutputRequest = field(default_factory=OutputRequest)
    # Set once the engine is known (its tool-call format): how to split the
    # answer into text and tool calls; None when the answer is text.
    tool_format: ToolFormat | None = None

    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)


def _pick(request_value: Any, default_value: Any, fallback: Any) -> Any:
    # An explicit 0 from the request is a value, not an absence.
    if request_value is not None:
        return request_value
    return default_value if default_value is not None else fallback


def resolve_sampling(asked: SamplingDefaults, spec: ModelSpec) -> SamplingParams:
    d = spec.defaults
    return SamplingParams(
        temperature=_pick(asked.temperature, d.temperature, FALLBACK.temperature),
        top_p=_pick(asked.top_p, d.top_p, FALLBACK.top_p),
        top_k=_pick(asked.top_k, d.top_k, FALLBACK.top_k),
        min_p=_pick(asked.min_p, d.min_p, FALLBACK.min_p),
        repetition_penalty=_pick(asked.repetition_penalty, d.repetition_penalty, FALLBACK.repetition_penalty),
        presence_penalty=_pick(asked.presence_penalty, d.presence_penalty, FALLBACK.presence_penalty),
        frequency_penalty=_pick(asked.frequency_penalty, d.frequency_penalty, FALLBACK.frequency_penalty),
        seed=_pick(asked.seed, d.seed, None),
    )


def sampling_set(asked: SamplingDefaults, spec: ModelSpec) -> frozenset[str]:
    """The sampling fields given by the request or the model's defaults."""
    return frozenset(
        name for name in SAMPLING_FIELDS
        if getattr(asked, name) is not None or getattr(spec.defaults, name) is not None
    )


SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def resolve_max_tokens(ctx: DaemonContext, asked: Requested, spec: ModelSpec) -> int:
    server = ctx.settings.server
    value = _pick(asked.sampling.max_tokens, spec.defaults.max_tokens, server.default_max_tokens)
    if value > server.max_request_tokens:
        raise BadRequest(
            f"max_tokens exceeds server limit ({server.max_request_tokens})", param="max_tokens"
        )
    return value


def _timeout(ctx: DaemonContext, asked: Requested) -> float:
    """The client may ask for less time than the server allows, never more."""
    limit = ctx.settings.server.request_timeout_s
    return min(asked.timeout, limit) if asked.timeout is not None else limit


# No tokenizer makes a token of more than this many characters on average
# over a whole prompt (English text is about 4): a prompt longer than
# max_context times this is refused before anyone tokenizes it.
MAX_CHARS_PER_TOKEN = 32


def check_prompt_length(spec: ModelSpec, chars: int, param: str) -> None:
    """A cheap bound before tokenizing: megabytes of prompt must not cost a
    tokenizer run (and the memory it takes) only to be refused afterwards."""
    limit = spec.max_context * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise BadRequest(
            f"This model's maximum context length is {spec.max_context} tokens, but the "
            f"{param} has {chars:,} characters, far more than fit. Shorten the {param}.",
            param=param,
            code="context_length_exceeded",
        )


def plan_chat(
    ctx: DaemonContext, asked: Requested, conversation: Conversation, *, kind: str = "chat", id_prefix: str = "chatcmpl-"
) -> Plan:
    spec = ctx.manager.resolve(asked.model)
    check_prompt_length(spec, conversation.text_length(), "messages")
    # A remote entry's images go to its backend, which decides whether its
    # model sees them (a text model's server answers 400 itself).
    takes_images = spec.kind == "vision" or spec.is_remote
    if conversation.has_images() and not takes_images:
        raise BadRequest(
            f"Model `{asked.model}` is a text model and does not accept images", param="messages"
        )
    images = collect_images(conversation, ImagePolicy.for_model(spec)) if takes_images else None
    if asked.output.asks_anything():
        out = asked.output
        check_output(tools=out.tools, tool_choice=out.tool_choice, response_format=out.response_format)
        if spec.kind == "vision" and not spec.is_remote and (out.tools or out.response_format):
            # What the vision engine would refuse, said before any stream opens.
            param = "tools" if out.tools else "response_format"
            raise BadRequest(f"Vision models do not support `{param}` yet.", param=param)
    request = GenerationRequest(
        request_id=f"{id_prefix}{uuid.uuid4().hex[:24]}",
        max_tokens=resolve_max_tokens(ctx, asked, spec),
        sampling=resolve_sampling(asked.sampling, spec),
        sampling_set=sampling_set(asked.sampling, spec),
        stop=list(asked.stop),
        messages=conversation.template_messages(),
        ignore_eos=asked.ignore_eos,
    )
    return Plan(
        kind=kind,
        spec=spec,
        requested_name=asked.model,
        requests=[request],
        stream=asked.stream,
        timeout=_timeout(ctx, asked),
        id=request.request_id,
        images=images,
        output=asked.output,
    )


def shape_output(plan: Plan, engine: Any) -> None:
    """Tools and structured output, checked against the leased engine's
    tool-call format (known only once the model is loaded): the template's
    ``tools`` and the grammar go on the engine requests, and the plan learns
    how to split the answer. A client mistake is a BadRequest naming its field."""
    if not plan.output.asks_anything():
        return
    asked = plan.output
    if getattr(engine, "kind", None) == "remote":
        # The backend has the model's tool-call format and its own grammar:
        # the fields go to it as the client sent them (checked for shape by
        # check_output), and its tool calls come back already split.
        for request in plan.requests:
            request.tools = asked.tools
            request.tool_choice = asked.tool_choice
            request.parallel_tool_calls = asked.parallel_tool_calls
            request.response_format = asked.response_format
        plan.tool_format = None
        return
    shaped = plan_output(
        plan.requested_name,
        getattr(engine, "tool_format", None),
        tools=asked.tools,
        tool_choice=asked.tool_choice,
        parallel_tool_calls=asked.parallel_tool_calls,
        response_format=asked.response_format,
    )
    for request in plan.requests:
        request.tools = shaped.tools
        request.constraint = shaped.constraint
    plan.tool_format = shaped.tool_format


def plan_prompts(
    ctx: DaemonContext, asked: Requested, prompts: list[str], *, kind: str = "completion", id_prefix: str = "cmpl-"
) -> Plan:
    limit = ctx.settings.server.max_prompts
    if len(prompts) > limit:
        raise BadRequest(
            f"At most {limit} prompts per request; this one has {len(prompts)}.", param="prompt"
        )
    spec = ctx.manager.resolve(asked.model)
    for i, prompt in enumerate(prompts):
        check_prompt_length(spec, len(prompt), "prompt" if len(prompts) == 1 else f"prompt[{i}]")
    max_tokens = resolve_max_tokens(ctx, asked, spec)
    sampling = resolve_sampling(asked.sampling, spec)
    given = sampling_set(asked.sampling, spec)
    plan_id = f"{id_prefix}{uuid.uuid4().hex[:24]}"
    requests = [
        GenerationRequest(
            request_id=f"{plan_id}-{i}", max_tokens=max_tokens, sampling=sampling, sampling_set=given,
            stop=list(asked.stop), prompt=prompt, ignore_eos=asked.ignore_eos,
        )
        for i, prompt in enumerate(prompts)
    ]
    return Plan(
        kind=kind,
        spec=spec,
        requested_name=asked.model,
        requests=requests,
        stream=asked.stream,
        timeout=_timeout(ctx, asked),
        id=plan_id,
    )
