"""Everything decided before a lease is taken, for any API surface: which
model, the fully resolved sampling and token limit, the engine requests, the
images to read and the request's deadline."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from mlxd.api.conversation import MAX_NESTING, Conversation, TextPart, encodable, json_bytes, nesting_depth
from mlxd.api.images import ImagePolicy, PendingImages, collect_images
from mlxd.api.prefill import settled
from mlxd.api.reasoning import ReasoningRequest, merged_template_kwargs
from mlxd.caller import ANONYMOUS, Caller
from mlxd.engine.types import GenerationRequest, PromptEnd, SamplingParams
from mlxd.errors import BadRequest, ContextTooLong, ModelNotFound, PermissionDenied
from mlxd.registry.kinds import CHAT, COMPLETION, ROUTE_PATHS, ModelKind
from mlxd.registry.model import FailoverSpec, ModelSpec, SamplingDefaults
from mlxd.engine.contract import AnswerFormats
from mlxd.tools.output_plan import check_output, whole_answer_grammar
from mlxd.tools.output_request import OutputRequest

if TYPE_CHECKING:
    from mlxd.api.context import DaemonContext

# Fallbacks when neither the request nor the model's defaults say.
FALLBACK = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                          frequency_penalty=0.0)


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
    # OpenAI's logit_bias, its keys as token ids (checked against the
    # leased model's vocabulary by its engine's ``prepare``).
    logit_bias: dict[int, float] | None = None
    # Thinking on or off, effort, budget, chat_template_kwargs (api/reasoning.py).
    reasoning: ReasoningRequest = field(default_factory=ReasoningRequest)
    # The client's max_tokens is a cap it always sends (Anthropic's field is
    # required, and Claude Code sends its hosted model's 64k-128k): above the
    # server's limit it means the limit, not a request mlxd must refuse.
    max_tokens_is_cap: bool = False
    # No max_tokens means as long as the answer runs, up to the server's
    # limit and the window (the Responses API's own meaning: Codex sends
    # none, and an answer cut at default_max_tokens is an error to it).
    open_ended: bool = False
    # Where a chat prompt ends: "continue" goes on from the last assistant
    # message (a prefill, api/prefill.py).
    prompt_end: PromptEnd = "new_turn"


@dataclass(frozen=True)
class Entry:
    """What a request names: a model, or a failover entry over its targets."""

    spec: ModelSpec
    failover: FailoverSpec | None = None
    # A failover entry's targets, in the file's order (``spec`` is the first).
    targets: tuple[ModelSpec, ...] = ()
    # What each of ``models`` is served as (its row of the kinds table).
    kinds: tuple[ModelKind, ...] = ()

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        return self.targets or (self.spec,)

    def served_as(self) -> list[tuple[ModelSpec, ModelKind]]:
        return list(zip(self.models, self.kinds, strict=True))


def resolve_entry(ctx: DaemonContext, name: str, caller: Caller = ANONYMOUS) -> Entry:
    """What a client's ``name`` stands for; an implicit failover target's
    own name (``backend:model``) is none of them. A model outside the
    caller's ``models:`` is its 403, and a name it may not use is not
    listed to it among the names that exist."""
    found = ctx.registry.find(name)
    if found is None:
        raise ModelNotFound(name, [n for n in ctx.registry.model_names() if caller.may_use(n)])
    check_model(caller, name, found.names())
    if isinstance(found, FailoverSpec):
        targets = tuple(ctx.manager.resolve(t) for t in found.targets)
        return Entry(targets[0], found, targets, tuple(ctx.registry.kind_of(t) for t in targets))
    spec = ctx.manager.resolve(found.name)
    return Entry(spec, kinds=(ctx.registry.kind_of(spec),))


def check_model(caller: Caller, asked: str, names: tuple[str, ...]) -> None:
    """PermissionDenied unless the entry ``asked`` resolved to (its
    ``names``: name and aliases as the registry writes them) falls in the
    caller's ``models:``. The name asked does not count by itself: with a
    glob alias (a catch-all ``*``) a client could make one up that matches
    its globs and reach an entry outside them. A name the scope lists
    itself, no glob, is the operator's own choice and counts."""
    if not (caller.may_use(*names) or caller.names_exactly(asked)):
        theirs = ", ".join(caller.models)
        why = f"its models: {theirs}" if asked in names else f"it is served by a model outside its models: {theirs}"
        raise PermissionDenied(f"App `{caller.app}` may not use model `{asked}` ({why})", param="model")


def check_route(entry: Entry, name: str, route: str) -> None:
    """A model (or every target) of a kind that does not serve ``route``
    (an embedding model asked to chat) is the client's 400."""
    if not any(route in kind.routes for kind in entry.kinds):
        kind = entry.kinds[0]
        article = "an" if kind.name[0] in "aeiou" else "a"
        served = "; ".join(ROUTE_PATHS[r] for r in sorted(kind.routes) if r in ROUTE_PATHS)
        raise BadRequest(f"Model `{name}` is {article} {kind.name} model, which this route does not serve; "
                         f"it serves {served}.", param="model", code="model_not_supported")


def merged_defaults(spec: ModelSpec, failover: FailoverSpec | None) -> SamplingDefaults:
    """A model's sampling defaults, under a failover entry's own where it sets them."""
    if failover is None:
        return spec.defaults
    over = failover.defaults
    return SamplingDefaults(**{
        f.name: getattr(over, f.name) if getattr(over, f.name) is not None else getattr(spec.defaults, f.name)
        for f in fields(SamplingDefaults)
    })


@dataclass
class Plan:
    kind: str  # what the request log calls it: "chat" | "completion" | ...
    # The model that serves the request: for a failover entry, the target
    # leased (before that, its first target).
    spec: ModelSpec
    requested_name: str
    requests: list[GenerationRequest]
    stream: bool
    timeout: float
    started: float = field(default_factory=time.monotonic)
    # The request gave its own ``timeout``: a stream ends at it too. (The
    # server's request_timeout_s bounds a stream's silences, not its length.)
    timeout_asked: bool = False
    id: str = ""
    # How the ids of the calls mlxd parses out of the answer begin, as the surface names them.
    call_id_prefix: str = "call_"
    created: int = field(default_factory=lambda: int(time.time()))
    # Vision chat: images checked against the model's rules, read before the lease.
    images: PendingImages | None = None
    output: OutputRequest = field(default_factory=OutputRequest)
    failover: FailoverSpec | None = None
    # What the request itself said about sampling: a failover target's own
    # defaults apply once it is leased.
    asked: SamplingDefaults = field(default_factory=SamplingDefaults)
    default_max_tokens: int = 512  # the server's, for a request and defaults that set none
    # A max_tokens above the server's limit means the limit (Requested.max_tokens_is_cap).
    max_tokens_is_cap: bool = False
    reasoning: ReasoningRequest = field(default_factory=ReasoningRequest)
    # What is asked to be done (a kinds table route: chat, completion).
    route: str = CHAT
    # Who is asking (from the gatekeeper): the lease, the accounts and the log carry it.
    caller: Caller = ANONYMOUS

    @property
    def name(self) -> str:
        """The entry the client asked for (metrics and logs count by it)."""
        return self.failover.name if self.failover is not None else self.spec.name

    @property
    def prompt_copies(self) -> int:
        """How many of ``requests`` are choices of one prompt (chat's ``n``):
        the prompt is read once, as OpenAI counts it."""
        return max(1, self.requests[0].choices) if self.requests else 1

    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)

    def accepts(self, kind: ModelKind) -> bool:
        """Whether a model of ``kind`` can serve this request (a failover
        target that cannot is skipped): one that serves its route, and for
        images one that takes them."""
        if self.route not in kind.routes:
            return False
        return self.images is None or not self.images.sources or kind.takes_images


@dataclass
class Attempt:
    """The request as it goes to one target: fresh copies of the plan's
    engine requests with that target's sampling and limits, which its
    engine settles the output request on (``GenerationEngine.prepare``),
    and how that engine said to split its answer. The plan itself is never
    rewritten, so what one target did (a forced call drops the stop strings)
    never reaches the next."""

    spec: ModelSpec
    requests: list[GenerationRequest]
    formats: AnswerFormats = field(default_factory=AnswerFormats)


def for_target(plan: Plan, spec: ModelSpec, max_request_tokens: int) -> Attempt:
    """``plan`` on ``spec``: a failover target's own sampling defaults under
    the entry's and the request's, and one max_tokens resolution that always
    checks the server limit (a target's default may be higher than the
    first target's was)."""
    defaults = merged_defaults(spec, plan.failover)
    max_tokens = limited_max_tokens(
        _pick(plan.asked.max_tokens, defaults.max_tokens, plan.default_max_tokens),
        max_request_tokens, is_cap=plan.max_tokens_is_cap,
    )
    requests = []
    for request in plan.requests:
        sampling, given = request.sampling, request.sampling_set
        if plan.failover is not None:
            sampling = resolve_sampling(plan.asked, defaults)
            if plan.asked.seed is not None:  # n choices keep their own seeds
                sampling = replace(sampling, seed=request.sampling.seed)
            given = sampling_set(plan.asked, defaults)
        kwargs = request.chat_template_kwargs
        if request.messages is not None:
            # The target's own registry defaults under the request's.
            kwargs = merged_template_kwargs(spec, plan.reasoning)
        requests.append(replace(
            request, sampling=sampling, sampling_set=given, max_tokens=max_tokens,
            stop=list(request.stop), images=list(request.images), chat_template_kwargs=kwargs,
        ))
    return Attempt(spec, requests)


def _pick(request_value: Any, default_value: Any, fallback: Any) -> Any:
    # An explicit 0 from the request is a value, not an absence.
    if request_value is not None:
        return request_value
    return default_value if default_value is not None else fallback


def resolve_sampling(asked: SamplingDefaults, d: SamplingDefaults) -> SamplingParams:
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


def sampling_set(asked: SamplingDefaults, defaults: SamplingDefaults) -> frozenset[str]:
    """The sampling fields given by the request or the model's defaults."""
    return frozenset(
        name for name in SAMPLING_FIELDS
        if getattr(asked, name) is not None or getattr(defaults, name) is not None
    )


SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))


def resolve_max_tokens(ctx: DaemonContext, asked: Requested, defaults: SamplingDefaults) -> int:
    server = ctx.settings.server
    value = _pick(asked.sampling.max_tokens, defaults.max_tokens, fallback_max_tokens(ctx, asked))
    return limited_max_tokens(value, server.max_request_tokens, is_cap=asked.max_tokens_is_cap)


def fallback_max_tokens(ctx: DaemonContext, asked: Requested) -> int:
    """max_tokens when neither the request nor the model's defaults set it."""
    server = ctx.settings.server
    return server.max_request_tokens if asked.open_ended else server.default_max_tokens


def limited_max_tokens(value: int, limit: int, *, is_cap: bool) -> int:
    """``value`` against the server's limit: a cap the client always sends
    means the limit above it; anything else above it is refused."""
    if is_cap:
        value = min(value, limit)
    if value > limit:
        raise BadRequest(f"max_tokens exceeds server limit ({limit})", param="max_tokens")
    return value


def _timeout(ctx: DaemonContext, asked: Requested) -> float:
    """The client may ask for less time than the server allows, never more."""
    limit = ctx.settings.server.request_timeout_s
    return min(asked.timeout, limit) if asked.timeout is not None else limit


# No tokenizer makes a token of more than this many characters on average
# over a whole prompt (English text is about 4): a prompt longer than
# max_context times this is refused before anyone tokenizes it.
MAX_CHARS_PER_TOKEN = 32
# Tool definitions above this many bytes of JSON are refused whatever the
# context: the heaviest agents send a few hundred KB (Claude Code's 12 tools
# are ~60 KB), while megabytes of schema cost a template render, a tokenizer
# run and a grammar compile before any other bound could refuse them.
MAX_TOOL_BYTES = 1 << 20


def check_prompt_length(entry: Entry, chars: int, param: str, what: str | None = None) -> None:
    """A cheap bound before tokenizing: megabytes of prompt must not cost a
    tokenizer run (and the memory it takes) only to be refused afterwards.
    (A failover entry's is its roomiest target's; each target's engine still
    checks its own context once the prompt is tokenized.) ``what`` names
    the parts counted, when more than ``param``."""
    max_context = max(m.max_context for m in entry.models)
    limit = max_context * MAX_CHARS_PER_TOKEN
    if chars > limit:
        what = what or param
        verb = "have" if what.endswith("s") else "has"
        raise ContextTooLong(
            f"This model's maximum context length is {max_context} tokens, but the "
            f"{what} {verb} {chars:,} characters, far more than fit. Shorten the {param}.",
            param=param, prompt_tokens=None, limit=max_context,
        )


def check_tool_size(tools: list[dict[str, Any]] | None) -> int:
    """About what the tool definitions add to the prompt (their JSON, as a
    template renders them), refused above MAX_TOOL_BYTES."""
    size = json_bytes(tools, MAX_TOOL_BYTES) if tools else 0
    if size > MAX_TOOL_BYTES:
        raise BadRequest(
            f"The tool definitions are more than {MAX_TOOL_BYTES:,} bytes of JSON; mlxd takes at most "
            f"{MAX_TOOL_BYTES:,} bytes. Send fewer tools or shorter schemas.",
            param="tools",
        )
    return size


def _image_policy(entry: Entry) -> ImagePolicy:
    if entry.failover is None:
        return ImagePolicy.for_model(entry.spec)
    f = entry.failover
    # Images are read (and sized) before a target is chosen: by the first
    # local vision target's processor, which its twins elsewhere share.
    vision = next((m for m, kind in entry.served_as() if kind.takes_images and not m.is_remote), None)
    return ImagePolicy(
        model=f.name,
        local_dir=f.local_image_dir.resolve() if f.local_image_dir else None,
        allow_remote=f.allow_remote_images,
        model_dir=vision.path if vision is not None else None,
    )


def check_conversation(conversation: Conversation, tools: list[dict[str, Any]] | None) -> None:
    """What no chat template can render, whatever the surface: no message
    at all, text that is not valid Unicode, earlier tool calls' arguments
    that are not JSON (templates take them as objects: the client's 400,
    named where it sent them), JSON nested past all reason. One pass, each
    call's arguments parsed once."""
    if not conversation.messages:
        raise BadRequest("The conversation has no messages; send at least one.", param="messages")
    for message in conversation.messages:
        texts = [p.text for p in message.parts() if isinstance(p, TextPart)] + [message.reasoning]
        names = [message.tool_call_id, message.name, *(s for c in message.tool_calls for s in (c.id, c.name))]
        if not encodable([texts, names]):
            raise _unencodable("The conversation", "messages")
        for call in message.tool_calls:
            try:
                arguments = json.loads(call.arguments)
            except ValueError:
                raise BadRequest(f"{call.param} is not valid JSON.", param=call.param) from None
            except RecursionError:  # deeper than Python's parser goes: far past the bound below
                raise BadRequest(f"A tool call's arguments nest deeper than {MAX_NESTING} levels.",
                                 param="messages") from None
            if not isinstance(arguments, dict):
                # Templates walk them as the parameters by name (Qwen3.5's `arguments|items`).
                raise BadRequest(f"{call.param} must be a JSON object of the function's arguments, "
                                 f"not {_json_kind(arguments)}.", param=call.param)
            if not encodable(arguments):
                raise _unencodable("The conversation", "messages")
            if nesting_depth(arguments) > MAX_NESTING:
                raise BadRequest(f"A tool call's arguments nest deeper than {MAX_NESTING} levels.", param="messages")
    if not encodable(tools):
        raise _unencodable("A tool definition", "tools")
    for tool in tools or ():
        if nesting_depth(tool) > MAX_NESTING:
            raise BadRequest(f"A tool definition nests deeper than {MAX_NESTING} levels.", param="tools")


def _unencodable(what: str, param: str) -> BadRequest:
    return BadRequest(f"{what} contains an unpaired UTF-16 surrogate; it is not valid Unicode text.", param=param)


def check_chat(entry: Entry, name: str, conversation: Conversation, output: OutputRequest) -> PendingImages | None:
    """What a chat request must pass before anything is read or leased (its
    answer and its token count alike); when a model it may go to takes
    images, the images to read."""
    tools = output.template_tools()  # as the template renders them
    tool_chars = check_tool_size(tools)  # first: the walks below cost what the tools weigh
    check_conversation(conversation, tools)
    text_chars = conversation.text_length()
    # What the template renders is the text and the tools alike: whichever
    # is the larger part is the one to shorten.
    check_prompt_length(entry, text_chars + tool_chars, "tools" if tool_chars > text_chars else "messages",
                        what="messages and tool definitions" if tool_chars else "messages")
    with_images = any(kind.takes_images for kind in entry.kinds)
    if conversation.has_images() and not with_images:
        raise BadRequest(f"Model `{name}` is a text model and does not accept images", param="messages")
    images = collect_images(conversation, _image_policy(entry)) if with_images else None
    _check_output(entry, output)
    return images


def _check_output(entry: Entry, output: OutputRequest) -> None:
    """The answer's shape, as far as it can be checked before the lease."""
    if not output.asks_anything():
        return
    check_output(output)
    without = [kind for m, kind in entry.served_as() if not kind.grammars and not m.is_remote]
    if len(without) == len(entry.kinds) and (output.tools or output.response_format is not None):
        # What the engine (vision) would refuse, said before any stream opens.
        param = "tools" if output.tools or output.response_format is None else output.response_format.param
        raise BadRequest(f"{without[0].name.capitalize()} models do not support `{param}` yet.", param=param)


def _check_ignore_eos(asked: Requested) -> None:
    """``ignore_eos`` decodes past the end of the answer, and a grammar over
    the whole answer (a JSON format, a forced call) ends it where the
    grammar does: past that end the grammar allows nothing, and the answer
    went on unconstrained, valid JSON then whatever the model wrote, which
    no client can parse."""
    param = whole_answer_grammar(asked.output) if asked.ignore_eos else None
    if param is not None:
        raise BadRequest(f"`ignore_eos` decodes past the end of the answer, and `{param}` ends the answer where its "
                         "grammar does: send one or the other.", param="ignore_eos")


def plan_chat(
    ctx: DaemonContext, asked: Requested, conversation: Conversation, *, kind: str = "chat", id_prefix: str = "chatcmpl-",
    caller: Caller = ANONYMOUS, call_id_prefix: str = "call_",
) -> Plan:
    entry = resolve_entry(ctx, asked.model, caller)
    check_route(entry, asked.model, CHAT)
    spec = entry.spec
    images = check_chat(entry, asked.model, conversation, asked.output)
    _check_ignore_eos(asked)
    asked = replace(asked, reasoning=settled(asked.prompt_end, asked.reasoning, asked.output))
    defaults = merged_defaults(spec, entry.failover)
    request = GenerationRequest(
        request_id=f"{id_prefix}{uuid.uuid4().hex[:24]}",
        max_tokens=resolve_max_tokens(ctx, asked, defaults),
        sampling=resolve_sampling(asked.sampling, defaults),
        sampling_set=sampling_set(asked.sampling, defaults),
        stop=list(asked.stop),
        messages=conversation.template_messages(),
        prompt_end=asked.prompt_end,
        ignore_eos=asked.ignore_eos,
        logit_bias=asked.logit_bias,
        chat_template_kwargs=merged_template_kwargs(spec, asked.reasoning),
        reasoning_budget=_pick(asked.reasoning.budget, defaults.reasoning_budget, None),
        reasoning_effort=asked.reasoning.asked_effort,
    )
    return Plan(
        kind=kind,
        spec=spec,
        requested_name=asked.model,
        requests=[request],
        stream=asked.stream,
        timeout=_timeout(ctx, asked),
        timeout_asked=asked.timeout is not None,
        id=request.request_id,
        call_id_prefix=call_id_prefix,
        images=images,
        output=asked.output,
        failover=entry.failover,
        asked=asked.sampling,
        default_max_tokens=fallback_max_tokens(ctx, asked),
        max_tokens_is_cap=asked.max_tokens_is_cap,
        reasoning=asked.reasoning,
        caller=caller,
    )


def plan_prompts(
    ctx: DaemonContext, asked: Requested, prompts: list[str], *, kind: str = "completion", id_prefix: str = "cmpl-",
    caller: Caller = ANONYMOUS,
) -> Plan:
    limit = ctx.settings.server.max_prompts
    if len(prompts) > limit:
        raise BadRequest(
            f"At most {limit} prompts per request; this one has {len(prompts)}.", param="prompt"
        )
    entry = resolve_entry(ctx, asked.model, caller)
    check_route(entry, asked.model, COMPLETION)
    for i, prompt in enumerate(prompts):
        check_prompt_length(entry, len(prompt), "prompt" if len(prompts) == 1 else f"prompt[{i}]")
    # Only response_format reaches here (a raw prompt has no template for tools):
    # its grammar constrains the text after the prompt as it does a chat answer.
    _check_output(entry, asked.output)
    _check_ignore_eos(asked)
    defaults = merged_defaults(entry.spec, entry.failover)
    max_tokens = resolve_max_tokens(ctx, asked, defaults)
    sampling = resolve_sampling(asked.sampling, defaults)
    given = sampling_set(asked.sampling, defaults)
    plan_id = f"{id_prefix}{uuid.uuid4().hex[:24]}"
    requests = [
        GenerationRequest(
            request_id=f"{plan_id}-{i}", max_tokens=max_tokens, sampling=sampling, sampling_set=given,
            stop=list(asked.stop), prompt=prompt, ignore_eos=asked.ignore_eos, logit_bias=asked.logit_bias,
        )
        for i, prompt in enumerate(prompts)
    ]
    return Plan(
        kind=kind,
        spec=entry.spec,
        requested_name=asked.model,
        requests=requests,
        stream=asked.stream,
        timeout=_timeout(ctx, asked),
        timeout_asked=asked.timeout is not None,
        id=plan_id,
        output=asked.output,
        failover=entry.failover,
        asked=asked.sampling,
        default_max_tokens=fallback_max_tokens(ctx, asked),
        max_tokens_is_cap=asked.max_tokens_is_cap,
        route=COMPLETION,
        caller=caller,
    )


def _json_kind(value: Any) -> str:
    """How JSON names what ``value`` was parsed from."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "a string" if isinstance(value, str) else "an array"
