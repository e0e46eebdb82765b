"""A finished request's accounts: its metrics, the model's token figures,
the request log line and its activity-log row. Shared by every API surface."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from mlxd.caller import Caller
from mlxd.monitoring.activity import ActivityRow
from mlxd.monitoring.telemetry import Finished
from mlxd.monitoring.usage import one_request

if TYPE_CHECKING:
    from mlxd.api.context import DaemonContext
    from mlxd.api.inflight import InFlightRequest
    from mlxd.api.plan import Plan
    from mlxd.monitoring.metrics import OutputMeter

log = logging.getLogger("mlxd.requests")


def record_request(
    ctx: DaemonContext, status: int, plan: Plan, tokens_in: int = 0, tokens_out: int = 0, *,
    ticket: InFlightRequest | None = None, meter: OutputMeter | None = None,
    cached: int = 0, finish: str | None = None, error: str | None = None,
) -> None:
    """Counted under the entry the client named (``plan.name``); a failover
    entry's figures also go to the target that served it (``plan.spec``)."""
    # n choices of one prompt: its tokens once, as the client's usage says,
    # so the app's tpm, day and usage charge what its answers reported.
    tokens_in, cached = tokens_in // plan.prompt_copies, cached // plan.prompt_copies
    ended = time.monotonic()
    seconds = ended - plan.started
    if meter is not None:
        meter.finish()
    first = meter.first_token_at if meter is not None else None
    # A request never accepted waited all its time (for a load that failed, a slot, its deadline).
    queued = ((meter.accepted_at or ended) - plan.started) if meter is not None else None
    if ctx.history is not None:
        ctx.history.request_finished(plan.name, first - plan.started if first is not None else None, cached)
    if ctx.telemetry is not None and ticket is not None:
        try:
            ctx.telemetry.record(Finished(
                request_id=ticket.request_id, response_id=plan.id, app=ticket.caller, model=plan.name,
                served_by=plan.spec.name, surface=plan.kind, status=status, started_at=ticket.started_at,
                ended_at=time.time(), ttft_seconds=first - plan.started if first is not None else None,
                tokens_in=tokens_in, tokens_out=tokens_out, finish_reason=finish, error=error,
            ))
        except Exception:  # telemetry must never fail a request
            log.exception("recording OpenTelemetry for %s failed", plan.name)
    if ticket is not None and ticket.capture is not None:
        ticket.capture.finished(status, finish, error)
    if ctx.activity is not None and ticket is not None:
        decoding = ended - first if first is not None else 0.0
        ctx.activity.add(ActivityRow(
            time=time.time(), request_id=ticket.request_id, response_id=plan.id, key=ticket.caller,
            model=plan.name, target=plan.spec.name, surface=plan.kind, stream=plan.stream, status=status,
            tokens_in=tokens_in, tokens_cached=cached, tokens_out=tokens_out,
            ttft_seconds=round(first - plan.started, 4) if first is not None else None,
            # The tokens after the first, over the time they took: decode speed.
            tokens_per_second=round((tokens_out - 1) / decoding, 2) if tokens_out > 1 and decoding > 0 else None,
            duration_seconds=round(seconds, 4), finish_reason=finish, error=error,
            queued_seconds=round(queued, 4) if queued is not None else None,
        ))
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
    ctx.limits.spend(plan.caller.app, tokens_in + tokens_out)
    ctx.usage.add(plan.caller.name, model, one_request(status, tokens_in, cached, tokens_out))
    extra = ""
    if ctx.settings.log_prompts:
        extra = " prompt=" + repr([r.messages or r.prompt for r in plan.requests])[:2000]
    where = f" backend={backend}" if backend is not None else ""
    where += caller_field(plan.caller)
    if plan.failover is not None:
        ctx.failover.finished(model, plan.spec.name, status)
        metrics.failover_requests.labels(model, plan.spec.name, str(status)).inc()
        where = f" target={plan.spec.name}{where}"
    timing = ""
    if queued is not None:
        timing += f" queued={queued:.3f}"
    if first is not None:
        timing += f" ttft={first - plan.started:.3f}"
    if ticket is not None:
        timing += f" request_id={ticket.request_id}"
    log.info(
        "%s model=%s%s status=%d tokens_in=%d tokens_out=%d seconds=%.3f stream=%s%s%s",
        plan.kind, model, where, status, tokens_in, tokens_out, seconds, plan.stream, timing, extra,
    )


def caller_field(caller: Caller) -> str:
    """A request log line's ``caller=`` (the app, else the key's name), or
    nothing where the daemon asks for no key: every surface's line names it."""
    return f" caller={caller.label}" if caller.key is not None or caller.app is not None else ""
