"""A finished request's accounts: its metrics, the model's token figures and
the request log line. Shared by every API surface."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlxd.api.context import DaemonContext
    from mlxd.api.plan import Plan

log = logging.getLogger("mlxd.requests")


def record_request(ctx: DaemonContext, status: int, plan: Plan, tokens_in: int = 0, tokens_out: int = 0) -> None:
    """Counted under the entry the client named (``plan.name``); a failover
    entry's figures also go to the target that served it (``plan.spec``)."""
    seconds = time.monotonic() - plan.started
    metrics = ctx.metrics
    model = plan.name
    metrics.requests.labels(model, str(status)).inc()
    metrics.request_seconds.labels(model).observe(seconds)
    backend = plan.spec.backend
    if backend is not None:
        metrics.backend_requests.labels(backend, model, str(status)).inc()
    if tokens_in:
        metrics.tokens.labels(model, "in").inc(tokens_in)
    if tokens_out:
        metrics.tokens.labels(model, "out").inc(tokens_out)
    ctx.manager.count_tokens(plan.spec.name, tokens_in, tokens_out)
    extra = ""
    if ctx.settings.log_prompts:
        extra = " prompt=" + repr([r.messages or r.prompt for r in plan.requests])[:2000]
    where = f" backend={backend}" if backend is not None else ""
    if plan.caller.key is not None or plan.caller.app is not None:
        where += f" caller={plan.caller.label}"
    if plan.failover is not None:
        ctx.failover.finished(model, plan.spec.name, status)
        metrics.failover_requests.labels(model, plan.spec.name, str(status)).inc()
        where = f" target={plan.spec.name}{where}"
    log.info(
        "%s model=%s%s status=%d tokens_in=%d tokens_out=%d seconds=%.3f stream=%s%s",
        plan.kind, model, where, status, tokens_in, tokens_out, seconds, plan.stream, extra,
    )
