"""The one request path of embeddings and reranking, for every surface:
the entry checked (an embedding or rerank model, before any lease), a lease
held while the inputs run (batched in the engine with every other
request's), raced against the client's disconnect and the deadline, the
vectors shortened where asked, and the accounts kept once."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from starlette.requests import Request

from mlxd.api.accounting import caller_field
from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.api.embeddings.bodies import EmbedInputs, RerankAsk
from mlxd.api.generation import guarded
from mlxd.api.plan import Entry, check_route, resolve_entry
from mlxd.api.refusals import ACCOUNTED
from mlxd.api.request_ids import request_id_of
from mlxd.caller import Caller
from mlxd.errors import BadRequest, MlxdError
from mlxd.monitoring.activity import Counted
from mlxd.monitoring.usage import one_request
from mlxd.registry.kinds import EMBED, RERANK
from mlxd.registry.model import ModelSpec
from mlxd.remote.encoders import read_embeddings, read_rerank

log = logging.getLogger("mlxd.requests")
T = TypeVar("T")


@dataclass(frozen=True)
class Embedded:
    model: str
    vectors: list[np.ndarray]
    tokens: int


@dataclass(frozen=True)
class Ranked:
    model: str
    # (document index, relevance score), best first, at most top_n.
    results: list[tuple[int, float]]
    tokens: int


def entry_for(ctx: DaemonContext, name: str, route: str, caller: Caller) -> ModelSpec:
    """The model ``name`` names, if its kind serves ``route`` (the kinds
    table's ``routes``); a 400 otherwise, before anything is loaded. A
    remote entry's kind is the one its entry declares (its backend's model)."""
    entry = resolve_entry(ctx, name, caller)
    if entry.failover is not None:
        raise BadRequest(f"`{name}` is a failover entry; {route} requests name one model", param="model")
    spec = entry.spec
    check_route(Entry(spec, kinds=(ctx.registry.kinds[spec.kind],)), name, route)
    return spec


async def embed(ctx: DaemonContext, request: Request, name: str, inputs: EmbedInputs, *,
                dimensions: int | None = None, truncate: bool = True) -> Embedded:
    spec = entry_for(ctx, name, EMBED, caller_of(request))

    async def work(engine: Any) -> tuple[Embedded, int]:
        if spec.is_remote:
            return await _remote_embed(engine, spec, name, inputs, dimensions), 0
        if dimensions is not None:
            # Refused before any input is read: it used to be after all of them were embedded.
            check_dimensions(dimensions, engine.dimensions, spec)
        encoded = await engine.encode(inputs.texts, inputs.arrays, truncate=truncate and spec.truncate)
        vectors = await engine.embed(encoded, priority=caller_of(request).priority)
        if dimensions is not None:
            vectors = shortened(vectors, dimensions)
        return Embedded(name, vectors, encoded.tokens), len(encoded.truncated)

    return await _leased(ctx, request, spec, "embeddings", len(inputs), work)


async def rerank(ctx: DaemonContext, request: Request, name: str, ask: RerankAsk) -> Ranked:
    spec = entry_for(ctx, name, RERANK, caller_of(request))

    async def work(engine: Any) -> tuple[Ranked, int]:
        if spec.is_remote:
            return await _remote_rerank(engine, spec, name, ask), 0
        scores, tokens = await engine.rerank(ask.query, ask.documents, truncate=spec.truncate,
                                             instruction=spec.instruction, priority=caller_of(request).priority)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return Ranked(name, [(i, scores[i]) for i in order[: ask.top_n]], tokens), 0

    return await _leased(ctx, request, spec, "rerank", len(ask.documents), work)


async def _remote_embed(engine: Any, spec: ModelSpec, name: str, inputs: EmbedInputs,
                        dimensions: int | None) -> Embedded:
    """Relayed like chat: the backend embeds (and shortens, if asked: it
    knows whether its model was trained for it)."""
    body: dict[str, Any] = {"input": list(inputs.texts) if inputs.texts is not None else
                            [list(a) for a in inputs.arrays or ()], "encoding_format": "base64"}
    if dimensions is not None:
        body["dimensions"] = dimensions
    answer = await engine.post_json("/embeddings", body)
    vectors, tokens = read_embeddings(answer, len(inputs), spec.backend or "")
    return Embedded(name, vectors, tokens)


async def _remote_rerank(engine: Any, spec: ModelSpec, name: str, ask: RerankAsk) -> Ranked:
    body: dict[str, Any] = {"query": ask.query, "documents": list(ask.documents), "return_documents": False}
    if ask.top_n is not None:
        body["top_n"] = ask.top_n
    answer = await engine.post_json("/rerank", body)
    results, tokens = read_rerank(answer, len(ask.documents), spec.backend or "")
    return Ranked(name, results[: ask.top_n], tokens)


def check_dimensions(dimensions: int, full: int, spec: ModelSpec) -> None:
    """A 400 for ``dimensions`` a model of ``full``-wide vectors cannot give:
    more than it makes, or fewer where it was not trained to be read that way."""
    if dimensions > full:
        raise BadRequest(f"`dimensions` is {dimensions} but `{spec.name}` makes vectors of {full}",
                         param="dimensions")
    if dimensions < full and not spec.matryoshka:
        raise BadRequest(
            f"`{spec.name}` was not trained for shorter embeddings (its entry has no `matryoshka: true`); "
            f"leave `dimensions` out or set it to {full}", param="dimensions")


def shortened(vectors: list[np.ndarray], dimensions: int) -> list[np.ndarray]:
    """Matryoshka (``check_dimensions`` passed): the first ``dimensions`` values, renormalised."""
    if vectors and dimensions == len(vectors[0]):
        return vectors
    out = []
    for v in vectors:
        cut = v[:dimensions]
        out.append(cut / max(float(np.linalg.norm(cut)), 1e-12))
    return out


async def _leased(ctx: DaemonContext, request: Request, spec: ModelSpec, what: str, inputs: int,
                  work: Callable[[Any], Awaitable[tuple[T, int]]]) -> T:
    started = time.monotonic()
    request.scope.setdefault("state", {})[ACCOUNTED] = True  # counted below, whatever happens
    timeout = ctx.settings.server.request_timeout_s
    status = 200
    result: Any = None
    truncated = 0

    async def leased() -> tuple[T, int]:
        lease = await ctx.manager.acquire(spec.name, timeout=timeout, caller=caller_of(request))
        try:
            return await work(lease.engine)
        finally:
            lease.release()

    try:
        result, truncated = await guarded(request, leased(), timeout)
        return result  # type: ignore[no-any-return]
    except MlxdError as exc:
        status = exc.status_code
        raise
    except BaseException:
        status = 500
        raise
    finally:
        tokens = result.tokens if result is not None else 0
        _account(ctx, caller_of(request), spec, what, status, time.monotonic() - started, tokens, inputs,
                 truncated, request_id_of(request.scope))


def _account(ctx: DaemonContext, caller: Caller, spec: ModelSpec, what: str, status: int,
             seconds: float, tokens: int, inputs: int, truncated: int, request_id: str) -> None:
    """Counted under the entry, not the name the client wrote: an alias
    (a glob's match above all) would split one model's figures and let
    made-up names add metric series and usage rows without end."""
    metrics = ctx.metrics
    name = spec.name
    counted = Counted(caller.name, name, status, tokens if status == 200 else 0)
    ctx.usage.add(caller.name, name, one_request(status, counted.tokens_in))
    if ctx.activity is not None:
        ctx.activity.add(counted)  # the usage table: it outlives a restart
    metrics.requests.labels(name, str(status)).inc()
    metrics.request_seconds.labels(name).observe(seconds)
    if status == 200:
        metrics.tokens.labels(name, "in").inc(tokens)
        metrics.encoder_inputs.labels(name).inc(inputs)
        if truncated:
            metrics.truncated_inputs.labels(name).inc(truncated)
        metrics.throughput.add(name, tokens)
        ctx.manager.count_tokens(spec.name, tokens, 0)
        ctx.limits.spend(caller.app, tokens)
    log.info("%s model=%s status=%d inputs=%d tokens_in=%d truncated=%d seconds=%.3f%s request_id=%s",
             what, name, status, inputs, tokens, truncated, seconds, caller_field(caller), request_id)
