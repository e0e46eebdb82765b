"""The FastAPI application, built around one DaemonContext."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxd import __version__
from mlxd.api.auth import check_api_key, check_route, route_group
from mlxd.api.limits import Admission
from mlxd.api.context import DaemonContext
from mlxd.api.error_responses import ErrorShape, error_response, install_error_handlers
from mlxd.api.audio import routes as audio
from mlxd.api.refusals import RefusalLog
from mlxd.api.anthropic import routes as anthropic
from mlxd.api.anthropic.error_shape import AnthropicErrors
from mlxd.api.embeddings import paths as embedding_paths
from mlxd.api.embeddings import routes as embeddings
from mlxd.api.embeddings.error_shape import OllamaErrors
from mlxd.api.openai import routes as openai
from mlxd.api.openai.error_shape import OpenAIErrors
from mlxd.api.responses import routes as responses
from mlxd.api.responses.bodies import FIELDS as RESPONSES_FIELDS
from mlxd.api.responses.store import ResponseStore
from mlxd.api.routes import activity, admin, cache, capture, gang, monitoring, requests
from mlxd.api.routes.admin import ConfigReloader
from mlxd.api.guards import RequestGuard
from mlxd.api.request_ids import RequestIds
from mlxd.errors import MlxdError, ShuttingDown

log = logging.getLogger("mlxd.http")

# Routes that answer without a key and stay up while draining.
OPEN_PATHS = ("/health",)
# Where the API is, beyond /v1/: keys and draining apply there alike.
API_PREFIXES = ("/v1/", embedding_paths.OLLAMA_PREFIX + "/", *embedding_paths.RERANK_PATHS)
# Keyed beside the API: the metrics, and the API schema (a map of every
# route and field for whoever probes the daemon). /docs and /redoc are not
# served at all.
KEYED_PATHS = ("/metrics", "/openapi.json")


class Gatekeeper:
    """API keys and draining, checked before routing. A plain ASGI middleware:
    Starlette's BaseHTTPMiddleware relays every streamed chunk through an
    extra memory stream and task switch (tens of microseconds per token)."""

    def __init__(self, app: ASGIApp, ctx: DaemonContext, shape_for: Callable[[str], ErrorShape]) -> None:
        self.app = app
        self.ctx = ctx
        self.shape_for = shape_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admission: Admission | None = None
        if scope["type"] == "http":
            path = scope["path"]
            try:
                if path not in OPEN_PATHS and (path.startswith(API_PREFIXES) or path in KEYED_PATHS):
                    # Who is asking, for every step after this one (request.state.caller).
                    apps = self.ctx.registry.apps
                    caller = check_api_key(Request(scope), self.ctx.settings.server, apps)
                    scope.setdefault("state", {})["caller"] = caller
                    check_route(caller, path)
                    if caller.app is not None and route_group(path) is not None:
                        admission = self.ctx.limits.admit(next((a for a in apps or () if a.name == caller.app), None))
                if self.ctx.draining and scope["method"] == "POST" and path.startswith(API_PREFIXES):
                    raise ShuttingDown("mlxd is shutting down; retry shortly", retry_after=5)
            except MlxdError as exc:
                if admission is not None:
                    self.ctx.limits.release(caller.app or "")
                await error_response(self.shape_for(path), exc)(scope, receive, send)
                return
        if admission is None:
            await self.app(scope, receive, send)
            return
        # The app's slot is held until the answer (a whole stream) has gone out.
        try:
            await self.app(scope, receive, _with_headers(send, admission.headers()))
        finally:
            self.ctx.limits.release(caller.app or "")


def _with_headers(send: Send, headers: dict[str, str]) -> Send:
    """``send`` adding ``headers`` to the response's start (an admitted
    request learns its headroom as OpenAI's clients read it)."""
    raw = [(k.encode(), v.encode()) for k, v in headers.items()]

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)

    return sending


async def _sample_history(ctx: DaemonContext) -> None:
    """One history sample per step, for as long as the app runs."""
    history = ctx.history
    assert history is not None
    while True:
        await asyncio.sleep(history.step_seconds)
        try:
            history.sample(ctx.manager.snapshot())
        except Exception:  # a chart gap, never a dead sampler
            log.exception("history sample failed")


def create_app(ctx: DaemonContext, reloader: ConfigReloader | None = None) -> FastAPI:
    """``reloader`` is None when there is no registry file to reload."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.worker.start()
        if ctx.activity is not None:
            ctx.activity.start()
            await asyncio.to_thread(ctx.restore_usage)
        await ctx.manager.start()
        # Polled in the background: a backend that is down at start is
        # reported, never a reason not to serve the others.
        await ctx.backends.start()
        sampling = asyncio.create_task(_sample_history(ctx)) if ctx.history is not None else None
        watching = reloader is not None and ctx.settings.watch_config
        if watching:
            await reloader.start_watching()
        try:
            yield
        finally:
            if sampling is not None:
                sampling.cancel()
            if watching:
                await reloader.stop_watching()
            # A SIGTERM drain has already done this; a plain stop has not.
            if not ctx.manager.shutting_down:
                await ctx.manager.shutdown(ctx.settings.server.shutdown_grace_seconds)
            await ctx.backends.close()
            await ctx.hosting.close()
            await ctx.worker.shutdown()
            if ctx.activity is not None:
                ctx.activity.stop()
            if ctx.telemetry is not None:
                await asyncio.to_thread(ctx.telemetry.shutdown)

    app = FastAPI(title="mlxd", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    openai_errors = OpenAIErrors()
    # OpenAI's errors, naming the Responses API's own fields.
    responses_errors = OpenAIErrors(RESPONSES_FIELDS)
    anthropic_errors = AnthropicErrors()
    ollama_errors = OllamaErrors()

    def shape_for(path: str) -> ErrorShape:
        # Each surface claims its paths.
        if path == anthropic.PREFIX or path.startswith(anthropic.PREFIX + "/"):
            return anthropic_errors
        if path == responses.PATH or path.startswith(responses.PATH + "/"):
            return responses_errors
        if path.startswith(embedding_paths.OLLAMA_PREFIX + "/"):
            return ollama_errors
        return openai_errors

    install_error_handlers(app, shape_for)

    app.add_middleware(Gatekeeper, ctx=ctx, shape_for=shape_for)

    # Added after the gatekeeper, so it runs before it: refused requests never reach the app.
    app.add_middleware(RequestGuard, server=lambda: ctx.settings.server, shape_for=shape_for)
    # Outside every guard: a generation or speech request refused before planning is an activity row.
    app.add_middleware(RefusalLog, activity=ctx.activity, usage=ctx.usage,
                       entry_name=lambda name: getattr(ctx.registry.find(name), "name", None),
                       metrics=ctx.metrics)
    # Outermost: every response, a refused one too, names its request.
    app.add_middleware(RequestIds)

    app.include_router(openai.router())
    app.include_router(anthropic.router())
    app.include_router(responses.router(ResponseStore()))
    app.include_router(embeddings.router())
    app.include_router(audio.router())
    app.include_router(admin.router(reloader))
    app.include_router(requests.router())
    app.include_router(cache.router())
    app.include_router(activity.router())
    app.include_router(capture.router())
    app.include_router(gang.router())
    # Also serves GET / and /dashboard, the status page.
    app.include_router(monitoring.router())

    return app
