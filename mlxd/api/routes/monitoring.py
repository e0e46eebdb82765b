"""Health, status, metrics and the dashboard page.

The app's gatekeeper asks for the API key on /v1/status and /metrics; /health
and the dashboard page are open (the page holds no data: it fetches
/v1/status with the key the browser keeps)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import cache
from typing import Any
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mlxd import __version__
from mlxd.api.app_scope import history_view, metrics_view, scoped
from mlxd.api.auth import caller_of
from mlxd.api.context import DaemonContext
from mlxd.caller import Caller
from mlxd.monitoring.status import app_problems, health_document, status_document
from mlxd.errors import MlxdError

NO_STORE = {"Cache-Control": "no-store"}


class MetricsDisabled(MlxdError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "metrics_disabled"


@cache
def dashboard_html() -> str:
    # Package data, read once: it cannot change while the process runs.
    return resources.files("mlxd.monitoring").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


# What an app's non-admin key reads of /v1/status: how the daemon and the
# machine are, and its own models and usage; not the configuration file and
# its reloads, the backends or the other apps' models. The document keeps
# its shape (the dashboard draws it as it draws any).
_APP_SECTIONS = ("schema_version", "generated_at", "health", "daemon", "memory")


def app_view(document: dict[str, Any], caller: Caller, problems: list[str]) -> dict[str, Any]:
    """``problems``: ``app_problems``, what the caller may read of why the daemon is degraded."""
    mine = [m for m in document["models"] if caller.may_use(m["name"], *m.get("aliases", ()))]
    names = {m["name"] for m in mine}
    out = {key: document[key] for key in _APP_SECTIONS}
    out["health"] = {"status": document["health"]["status"], "problems": problems}
    out["config"] = {"generation": document["config"]["generation"]}
    out["backends"] = []
    out["app"] = {"name": caller.app, "admin": caller.admin, "priority": caller.priority,
                  "models": list(caller.models), "routes": list(caller.routes)}
    out["models"] = mine
    out["failover"] = [f for f in document["failover"] if caller.may_use(f["name"], *f["aliases"])]
    out["events"] = [e for e in document["events"] if e["model"] in names]
    if "usage" in document:
        out["usage"] = [u for u in document["usage"] if u["app"] == caller.app]
    out["apps"] = [a for a in document.get("apps", ()) if a["name"] == caller.app]
    return out


def _names(ctx: DaemonContext) -> Callable[[str], tuple[str, ...]]:
    """A model's names (its aliases too), as a scope is matched against."""

    def names_of(name: str) -> tuple[str, ...]:
        # A failover entry's too: a request may use one by its alias.
        entry = ctx.registry.find(name)
        return entry.names() if entry is not None else (name,)

    return names_of


def router() -> APIRouter:
    api = APIRouter()

    # HEAD as a route of its own, left out of the schema: one route with
    # both methods gave both the same operation id (FastAPI warned).
    @api.head("/health", include_in_schema=False)
    @api.get("/health")
    async def health(request: Request) -> Response:
        response = JSONResponse(health_document(request.app.state.ctx.snapshot()), headers=NO_STORE)
        if request.method == "HEAD":
            # Load balancers and `curl -I` probe with HEAD: GET's status and
            # headers (its content-length too), no body.
            return Response(status_code=response.status_code, headers=dict(response.headers))
        return response

    @api.get("/v1/status")
    async def status(request: Request) -> Response:
        # Serialised directly: FastAPI's encoder would walk the whole
        # document again, and this endpoint must stay cheap under load.
        snapshot = request.app.state.ctx.snapshot()
        document = status_document(snapshot)
        caller = caller_of(request)
        if scoped(caller):
            names_of = _names(request.app.state.ctx)
            document = app_view(document, caller, app_problems(snapshot, lambda name: caller.may_use(*names_of(name))))
        body = json.dumps(document, separators=(",", ":"), allow_nan=False)
        return Response(body, media_type="application/json", headers=NO_STORE)

    @api.get("/v1/history")
    async def history(request: Request, after: float | None = None) -> Response:
        ctx: DaemonContext = request.app.state.ctx
        if ctx.history is None:
            return JSONResponse({"object": "history", "t": [], "models": {}}, headers=NO_STORE)
        history = ctx.history
        samples = history.since(after)

        caller = caller_of(request)

        def build() -> str:
            document = history.columns(samples)
            if scoped(caller):
                document = history_view(document, caller, _names(ctx))
            return json.dumps(document, separators=(",", ":"), allow_nan=False)

        # A page's first fetch is the whole hour (~0.1 s for 8 models): off the loop.
        body = await asyncio.to_thread(build) if len(samples) > 60 else build()
        return Response(body, media_type="application/json", headers=NO_STORE)

    @api.get("/metrics")
    async def metrics(request: Request) -> Response:
        ctx: DaemonContext = request.app.state.ctx
        if not ctx.settings.metrics:
            raise MetricsDisabled("The metrics endpoint is disabled (MLXD_METRICS=false)")
        text, caller = ctx.metrics.render(), caller_of(request)
        if scoped(caller):
            text = metrics_view(text, caller, _names(ctx))
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @api.get("/", response_model=None)
    async def root(request: Request) -> HTMLResponse | JSONResponse:
        if _wants_html(request):
            return HTMLResponse(dashboard_html(), headers=NO_STORE)
        return JSONResponse(
            {"name": "mlxd", "version": __version__, "status": "/v1/status", "dashboard": "/dashboard"}
        )

    @api.get("/dashboard")
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(dashboard_html(), headers=NO_STORE)

    return api
