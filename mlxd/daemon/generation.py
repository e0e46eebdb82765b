"""From an OpenAI request to engine output: resolve parameters, hold a lease,
race the work against the client's disconnect and the request's deadline,
and frame the answer as JSON or as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from mlxd.daemon.api_models import ChatCompletionRequest, CompletionRequest
from mlxd.daemon.context import DaemonContext
from mlxd.daemon.images import ImagePolicy, PendingImages, collect_images, without_image_data
from mlxd.engine.types import GenerationChunk, GenerationRequest, SamplingParams
from mlxd.errors import (
    BadRequest,
    ClientDisconnected,
    MlxdError,
    ModelPreempted,
    RequestTimeout,
    describe_exception,
)
from mlxd.registry.model import ModelSpec
from mlxd.residency.shell import Lease

log = logging.getLogger("mlxd.requests")
T = TypeVar("T")

# Fallbacks when neither the request nor the model's defaults say.
FALLBACK = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0)


@dataclass
class Plan:
    """Everything decided before a lease is taken."""

    kind: str  # "chat" | "completion"
    spec: ModelSpec
    requested_name: str
    requests: list[GenerationRequest]
    stream: bool
    include_usage: bool
    timeout: float
    started: float = field(default_factory=time.monotonic)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    # Vision chat: images checked against the model's rules, read before the lease.
    images: PendingImages | None = None

    def remaining(self) -> float:
        return self.timeout - (time.monotonic() - self.started)


def _pick(request_value: Any, default_value: Any, fallback: Any) -> Any:
    # An explicit 0 from the request is a value, not an absence.
    if request_value is not None:
        return request_value
    return default_value if default_value is not None else fallback


def resolve_sampling(body: ChatCompletionRequest | CompletionRequest, spec: ModelSpec) -> SamplingParams:
    d = spec.defaults
    return SamplingParams(
        temperature=_pick(body.temperature, d.temperature, FALLBACK.temperature),
        top_p=_pick(body.top_p, d.top_p, FALLBACK.top_p),
        top_k=_pick(body.top_k, d.top_k, FALLBACK.top_k),
        min_p=_pick(body.min_p, d.min_p, FALLBACK.min_p),
        repetition_penalty=_pick(body.repetition_penalty, d.repetition_penalty, FALLBACK.repetition_penalty),
        presence_penalty=_pick(body.presence_penalty, d.presence_penalty, FALLBACK.presence_penalty),
        seed=_pick(body.seed, d.seed, None),
    )


def resolve_max_tokens(ctx: DaemonContext, body: ChatCompletionRequest | CompletionRequest, spec: ModelSpec) -> int:
    server = ctx.settings.server
    value = _pick(body.requested_max_tokens(), spec.defaults.max_tokens, server.default_max_tokens)
    if value > server.max_request_tokens:
        raise BadRequest(
            f"max_tokens exceeds server limit ({server.max_request_tokens})", param="max_tokens"
        )
    return value


# No tokenizer makes a token of more than this many characters on average
# over a whole prompt (English text is about 4): a prompt longer than
# max_context times this is refused before anyone tokenizes it.
MAX_CHARS_PER_TOKEN = 32


def request_timeout(ctx: DaemonContext, body: ChatCompletionRequest | CompletionRequest) -> float:
    """The client may ask for less time than the server allows, never more."""
    limit = ctx.settings.server.request_timeout_s
    return min(body.timeout, limit) if body.timeout is not None else limit


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


def plan_chat(ctx: DaemonContext, body: ChatCompletionRequest) -> Plan:
    body.unsupported()
    spec = ctx.manager.resolve(body.model)
    check_prompt_length(spec, body.text_length(), "messages")
    if body.has_images() and spec.kind != "vision":
        raise BadRequest(
            f"Model `{body.model}` is a text model and does not accept images", param="messages"
        )
    messages = body.plain_messages()
    images = None
    if spec.kind == "vision":
        images = collect_images(messages, ImagePolicy.for_model(spec))
        messages = without_image_data(messages)
    request = GenerationRequest(
        request_id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
        max_tokens=resolve_max_tokens(ctx, body, spec),
        sampling=resolve_sampling(body, spec),
        stop=body.stop_list(),
        messages=messages,
        ignore_eos=body.ignore_eos,
    )
    return Plan(
        kind="chat",
        spec=spec,
        requested_name=body.model,
        requests=[request],
        stream=body.stream,
        include_usage=body.include_usage,
        timeout=request_timeout(ctx, body),
        id=request.request_id,
        images=images,
    )


def plan_completion(ctx: DaemonContext, body: CompletionRequest) -> Plan:
    body.unsupported()
    prompts = body.prompts()
    limit = ctx.settings.server.max_prompts
    if len(prompts) > limit:
        raise BadRequest(
            f"At most {limit} prompts per request; this one has {len(prompts)}.", param="prompt"
        )
    spec = ctx.manager.resolve(body.model)
    for i, prompt in enumerate(prompts):
        check_prompt_length(spec, len(prompt), "prompt" if len(prompts) == 1 else f"prompt[{i}]")
    max_tokens = resolve_max_tokens(ctx, body, spec)
    sampling = resolve_sampling(body, spec)
    plan_id = f"cmpl-{uuid.uuid4().hex[:24]}"
    requests = [
        GenerationRequest(
            request_id=f"{plan_id}-{i}", max_tokens=max_tokens, sampling=sampling,
            stop=body.stop_list(), prompt=prompt, ignore_eos=body.ignore_eos,
        )
        for i, prompt in enumerate(prompts)
    ]
    return Plan(
        kind="completion",
        spec=spec,
        requested_name=body.model,
        requests=requests,
        stream=body.stream,
        include_usage=body.include_usage,
        timeout=request_timeout(ctx, body),
        id=plan_id,
    )


# --- racing work against disconnects and deadlines ---------------------------


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away. The body has been read already, so
    the next ASGI message can only be the disconnect."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def guarded(request: Request, work: Awaitable[T], timeout: float) -> T:
    """Run ``work`` until it finishes, the client disconnects (499) or the
    deadline passes (504). Either way the work is cancelled and awaited, so
    whatever it held (a lease) has been given back when this returns."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if watcher in done:
        raise ClientDisconnected("client disconnected")
    raise RequestTimeout(f"Request timed out after {timeout:.1f} seconds")


# --- non-streaming ------------------------------------------------------------


@dataclass
class Outcome:
    texts: list[str]
    finish_reasons: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


async def _generate_all(ctx: DaemonContext, plan: Plan, lease: Lease) -> Outcome:
    outcome = Outcome(texts=[], finish_reasons=[])
    meter = ctx.metrics.meter(plan.spec.name, plan.started)
    for request in plan.requests:
        parts: list[str] = []
        last = GenerationChunk(text="")
        async with contextlib.aclosing(lease.engine.generate(request)) as chunks:
            async for chunk in chunks:
                meter.chunk(request.request_id, chunk)
                parts.append(chunk.text)
                last = chunk
        if last.finish_reason == "abort":
            raise ModelPreempted(
                f"Generation on `{plan.requested_name}` was interrupted: the model was preempted "
                "or the daemon is shutting down",
                retry_after=5,
            )
        outcome.texts.append("".join(parts))
        outcome.finish_reasons.append(last.finish_reason or "stop")
        outcome.prompt_tokens += last.prompt_tokens
        outcome.completion_tokens += last.completion_tokens
        outcome.cached_tokens += last.cached_tokens
    return outcome


async def _read_images_and_acquire(ctx: DaemonContext, plan: Plan) -> Lease:
    """Images are read (files, remote fetches, headers) before the lease, so
    a bad image is a 400 that never loads a model or holds a slot; they are
    decoded only once the lease is held, so requests the queue refuses never
    decode anything, and under the daemon-wide image memory bound."""
    images = plan.images if plan.images is not None and plan.images.sources else None
    if images is not None:
        await images.read()
    lease = await ctx.manager.acquire(plan.requested_name, timeout=plan.remaining())
    if images is not None:
        try:
            plan.requests[0].images = await images.decode(ctx.image_memory)
        except BaseException:
            lease.release()
            raise
    return lease


async def complete(ctx: DaemonContext, plan: Plan, request: Request) -> dict[str, Any]:
    async def work() -> Outcome:
        async with await _read_images_and_acquire(ctx, plan) as lease:
            return await _generate_all(ctx, plan, lease)

    try:
        outcome = await guarded(request, work(), plan.remaining())
    except MlxdError as exc:
        ctx.record_request(plan.spec.name, exc.status_code, plan)
        raise
    ctx.record_request(plan.spec.name, 200, plan, outcome.prompt_tokens, outcome.completion_tokens)
    usage = _usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
    if plan.kind == "chat":
        return {
            "id": plan.id,
            "object": "chat.completion",
            "created": plan.created,
            "model": plan.requested_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": outcome.texts[0]},
                    "finish_reason": outcome.finish_reasons[0],
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    return {
        "id": plan.id,
        "object": "text_completion",
        "created": plan.created,
        "model": plan.requested_name,
        "choices": [
            {"index": i, "text": text, "finish_reason": reason, "logprobs": None}
            for i, (text, reason) in enumerate(zip(outcome.texts, outcome.finish_reasons))
        ],
        "usage": usage,
    }


def _usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


# --- streaming ---------------------------------------------------------------
# Server-sent events are framed here on Starlette's StreamingResponse rather
# than with sse-starlette: the lease must be given back even when the body is
# never iterated, heartbeats must flow while the engine is silent without
# counting as progress, and OpenAI clients expect exactly "data: [DONE]\n\n".


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


DONE = "data: [DONE]\n\n"
HEARTBEAT = ": heartbeat\n\n"
_END = object()


class LeasedStreamingResponse(StreamingResponse):
    """A stream that gives its lease back however it ends, even when the
    client is gone before the first byte and the body is never iterated."""

    def __init__(self, content: AsyncIterator[str], lease: Lease, **kw: Any) -> None:
        super().__init__(content, media_type="text/event-stream", **kw)
        self._lease = lease
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self._content.aclose()  # type: ignore[attr-defined]
            self._lease.release()


async def open_stream(ctx: DaemonContext, plan: Plan, request: Request) -> LeasedStreamingResponse:
    """Acquire before answering, so a 404/503/504 is a real status code; once
    the 200 is sent, errors travel in the stream."""
    try:
        lease = await guarded(request, _read_images_and_acquire(ctx, plan), plan.remaining())
    except MlxdError as exc:
        ctx.record_request(plan.spec.name, exc.status_code, plan)
        raise
    events = _events(ctx, plan, lease)
    return LeasedStreamingResponse(
        events, lease, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def _pump(engine: Any, requests: list[GenerationRequest], queue: asyncio.Queue[Any]) -> None:
    try:
        for index, request in enumerate(requests):
            async with contextlib.aclosing(engine.generate(request)) as chunks:
                async for chunk in chunks:
                    queue.put_nowait((index, chunk))
        queue.put_nowait(_END)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        queue.put_nowait(exc)


class _StreamState:
    """Turns engine output into SSE frames and keeps the stream's accounts."""

    def __init__(self, ctx: DaemonContext, plan: Plan) -> None:
        self.plan = plan
        self.frames = _Frames(plan)
        self.meter = ctx.metrics.meter(plan.spec.name, plan.started)
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        # Running counts of the generation in progress (its chunks carry
        # them): a stream that ends early is logged with what it really cost.
        self._partial = (0, 0)
        self.status = 200

    def totals(self) -> tuple[int, int]:
        """Prompt and completion tokens so far, the unfinished prompt included."""
        return self.prompt_tokens + self._partial[0], self.completion_tokens + self._partial[1]

    def handle(self, item: Any) -> tuple[list[str], bool]:
        """Frames for one queue item, and whether the stream is over."""
        if item is _END:
            return [], True
        if isinstance(item, BaseException):
            self.status = item.status_code if isinstance(item, MlxdError) else 500
            log.error("stream on %s failed: %s", self.plan.spec.name, describe_exception(item))
            return [_sse(self.frames.error(item))], True
        index, chunk = item
        self.meter.chunk(index, chunk)
        self._partial = (chunk.prompt_tokens, chunk.completion_tokens)
        if chunk.finish_reason == "abort":
            self.status = 503
            return [_sse(self.frames.error(ModelPreempted(
                f"Generation on `{self.plan.requested_name}` was interrupted: the model was preempted "
                "or the daemon is shutting down")))], True
        out = [_sse(self.frames.content(index, chunk.text))] if chunk.text else []
        if chunk.finish_reason:
            self._partial = (0, 0)
            self.prompt_tokens += chunk.prompt_tokens
            self.completion_tokens += chunk.completion_tokens
            self.cached_tokens += chunk.cached_tokens
            usage = _usage(chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens)
            out.append(_sse(self.frames.finish(index, chunk.finish_reason, usage)))
        return out, False


async def _events(ctx: DaemonContext, plan: Plan, lease: Lease) -> AsyncIterator[str]:
    queue: asyncio.Queue[Any] = asyncio.Queue()
    producer = asyncio.ensure_future(_pump(lease.engine, plan.requests, queue))
    state = _StreamState(ctx, plan)
    heartbeat = ctx.settings.heartbeat_seconds
    inactivity = ctx.settings.server.request_timeout_s
    loop = asyncio.get_running_loop()
    last_progress = loop.time()
    try:
        if plan.kind == "chat":
            yield _sse(state.frames.chat_chunk({"role": "assistant", "content": ""}, None))
        done = False
        while not done:
            try:
                item = await asyncio.wait_for(queue.get(), heartbeat)
            except asyncio.TimeoutError:
                if loop.time() - last_progress >= inactivity:
                    state.status = 504
                    yield _sse(state.frames.error(RequestTimeout(f"No output for {inactivity:.0f} seconds")))
                    break
                yield HEARTBEAT
                continue
            last_progress = loop.time()
            out, done = state.handle(item)
            # Whatever else is already queued goes out in the same write: one
            # send per batch of tokens instead of one per token.
            while not done and not queue.empty():
                more, done = state.handle(queue.get_nowait())
                out += more
            if out:
                yield "".join(out)
        if state.status == 200 and plan.include_usage:
            yield _sse(state.frames.usage(_usage(state.prompt_tokens, state.completion_tokens, state.cached_tokens)))
        yield DONE
    except (GeneratorExit, asyncio.CancelledError):
        state.status = 499  # the client went away mid-stream
        raise
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await producer
        lease.release()
        ctx.record_request(plan.spec.name, state.status, plan, *state.totals())


class _Frames:
    """OpenAI's chunk objects for chat and completions streams."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.plan.kind == "chat" else "text_completion"
        return {"id": self.plan.id, "object": kind, "created": self.plan.created, "model": self.plan.requested_name}

    def chat_chunk(self, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        return {**self._base(), "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def content(self, index: int, text: str) -> dict[str, Any]:
        if self.plan.kind == "chat":
            return self.chat_chunk({"content": text}, None, index)
        return {**self._base(), "choices": [{"index": index, "text": text, "finish_reason": None, "logprobs": None}]}

    def finish(self, index: int, reason: str, usage: dict[str, Any]) -> dict[str, Any]:
        if self.plan.kind == "chat":
            frame = self.chat_chunk({}, reason, index)
        else:
            frame = {**self._base(), "choices": [{"index": index, "text": "", "finish_reason": reason, "logprobs": None}]}
        frame["usage"] = usage
        return frame

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        return {**self._base(), "choices": [], "usage": usage}

    @staticmethod
    def error(exc: BaseException) -> dict[str, Any]:
        if isinstance(exc, MlxdError):
            return exc.body()
        return {"error": {"message": "Internal error during generation", "type": "server_error",
                          "param": None, "code": "internal_error"}}

