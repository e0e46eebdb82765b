"""OpenTelemetry, off unless configured (``MLXD_OTLP_ENDPOINT``): the GenAI
semantic conventions' model-server metrics and one span per request,
exported over OTLP/HTTP. ``opentelemetry-sdk`` is an optional extra
(``pip install 'mlxd[otel]'``); nothing here is imported without it.

The providers are the daemon's own, never the process-global ones, so two
daemons in one process (the tests) do not share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxd.errors import ConfigError

# The conventions' advised bucket boundaries.
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = tuple(4**i for i in range(14))
# The request log's kinds as the conventions' operation names.
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completion": "text_completion"}


@dataclass(frozen=True)
class Finished:
    """One request as telemetry records it (times: epoch seconds)."""

    request_id: str
    response_id: str
    app: str
    model: str
    served_by: str
    surface: str
    status: int
    started_at: float
    ended_at: float
    ttft_seconds: float | None
    tokens_in: int
    tokens_out: int
    finish_reason: str | None
    error: str | None


class Telemetry:
    def __init__(self, meter_provider: Any, tracer_provider: Any) -> None:
        from mlxd import __version__

        self.meter_provider = meter_provider
        self.tracer_provider = tracer_provider
        meter = meter_provider.get_meter("mlxd", __version__)
        self.tracer = tracer_provider.get_tracer("mlxd", __version__)
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration", unit="s", description="Generative AI server request duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token", unit="s", description="Time to generate first token",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS)
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token", unit="s",
            description="Time per output token generated after the first token",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS)
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Input and output tokens, as served",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)

    @classmethod
    def otlp(cls, endpoint: str) -> Telemetry:
        """Metrics and spans to an OTLP/HTTP collector at ``endpoint``
        (``http://host:4318``)."""
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise ConfigError(
                "MLXD_OTLP_ENDPOINT is set but OpenTelemetry is not installed: pip install 'mlxd[otel]'",
                key="MLXD_OTLP_ENDPOINT",
            ) from None
        base = endpoint.rstrip("/")
        resource = Resource.create({"service.name": "mlxd"})
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics"))
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
        return cls(MeterProvider(resource=resource, metric_readers=[reader]), tracer_provider)

    def record(self, done: Finished) -> None:
        """Called once per finished request, on the event loop: the SDK's
        recording is in-memory; its exporters send from their own threads."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        operation = OPERATIONS.get(done.surface, done.surface)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "mlxd",
            "gen_ai.request.model": done.model,
            "gen_ai.response.model": done.served_by,
            "mlxd.app": done.app,
        }
        if done.status >= 400:
            attributes["error.type"] = str(done.status)
        seconds = max(0.0, done.ended_at - done.started_at)
        self.duration.record(seconds, attributes)
        if done.status < 400 and done.ttft_seconds is not None:
            self.ttft.record(done.ttft_seconds, attributes)
            if done.tokens_out > 1:
                self.tpot.record((seconds - done.ttft_seconds) / (done.tokens_out - 1), attributes)
        for kind, count in (("input", done.tokens_in), ("output", done.tokens_out)):
            if count:
                self.tokens.record(count, {**attributes, "gen_ai.token.type": kind})
        span = self.tracer.start_span(
            f"{operation} {done.model}", kind=SpanKind.SERVER, start_time=int(done.started_at * 1e9),
            attributes={
                **attributes,
                "gen_ai.response.id": done.response_id,
                "gen_ai.usage.input_tokens": done.tokens_in,
                "gen_ai.usage.output_tokens": done.tokens_out,
                "gen_ai.response.finish_reasons": [done.finish_reason] if done.finish_reason else [],
                "http.response.status_code": done.status,
                "mlxd.request_id": done.request_id,
            },
        )
        if done.status >= 400:
            span.set_status(Status(StatusCode.ERROR, done.error or str(done.status)))
        span.end(end_time=int(done.ended_at * 1e9))

    def shutdown(self) -> None:
        for provider in (self.meter_provider, self.tracer_provider):
            try:
                provider.shutdown()
            except Exception:  # an unreachable collector must not hold up the exit
                pass
