"""The FastAPI application, built around one DaemonContext."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request

from mlxd import __version__
from mlxd.daemon.auth import check_api_key
from mlxd.daemon.context import DaemonContext
from mlxd.daemon.errors import error_response, install_error_handlers
from mlxd.daemon.guards import RequestGuard
from mlxd.daemon.routes import admin, monitoring, openai
from mlxd.errors import MlxdError, ShuttingDown

log = logging.getLogger("mlxd.http")

# Routes that answer without a key and stay up while draining.
OPEN_PATHS = ("/health",)


def create_app(ctx: DaemonContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.worker.start()
        await ctx.manager.start()
        # Set by wire_reloader (mlxd.daemon.reload) when the daemon can reload.
        reloader = getattr(app.state, "reloader", None)
        if reloader is not None and ctx.settings.watch_config:
            await reloader.start_watching()
        try:
            yield
        finally:
            if reloader is not None:
                await reloader.stop_watching()
            # A SIGTERM drain has already done this; a plain stop has not.
            if not ctx.manager.core.shutting_down:
                await ctx.manager.shutdown(ctx.settings.server.shutdown_grace_seconds)
            await ctx.worker.shutdown()

    app = FastAPI(title="mlxd", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    install_error_handlers(app)

    @app.middleware("http")
    async def gatekeeper(request: Request, call_next):  # type: ignore[no-untyped-def]
        path = request.url.path
        try:
            if path not in OPEN_PATHS and (path.startswith("/v1/") or path == "/metrics"):
                check_api_key(request, ctx.settings.server.api_keys)
            if ctx.draining and request.method == "POST" and path.startswith("/v1/"):
                raise ShuttingDown("mlxd is shutting down; retry shortly", retry_after=5)
        except MlxdError as exc:
            return error_response(exc)
        return await call_next(request)

    # Added last, so it runs first: refused requests never reach the app.
    app.add_middleware(RequestGuard, server=lambda: ctx.settings.server)

    app.include_router(openai.router())
    app.include_router(admin.router())
    # Also serves GET / and /dashboard, the status page.
    app.include_router(monitoring.router())

    return app
