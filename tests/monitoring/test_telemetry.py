"""OpenTelemetry against a real daemon, read back through the SDK's
in-memory reader and exporter: the GenAI conventions' server metrics with
model and app attributes, and one span per request. Off unless configured."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from monitoring.monitoring_support import chat
from support.daemon import daemon_in_thread, write_registry

from mlxd.errors import ConfigError
from mlxd.monitoring.telemetry import Telemetry

pytestmark = pytest.mark.mlx

KEY = "sk-otel"
APP = "key:" + hashlib.sha256(KEY.encode()).hexdigest()[:8]


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(MeterProvider(metric_readers=[reader]), tracer_provider)
    tmp = tmp_path_factory.mktemp("otel")
    registry = write_registry(tmp, [{"name": "qwen", "model": "qwen", "aliases": ["default"]}])
    with daemon_in_thread(registry, tmp, telemetry=telemetry, api_keys=KEY) as d:
        yield d, reader, spans


def _points(reader) -> dict[str, list]:
    found: dict[str, list] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def test_a_request_is_recorded_under_the_genai_server_metrics_and_as_a_span(observed):
    daemon, reader, spans = observed
    answer = chat(daemon, "default", max_tokens=6, headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "otel-1"})
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    points = _points(reader)
    for name in ("gen_ai.server.request.duration", "gen_ai.server.time_to_first_token",
                 "gen_ai.server.time_per_output_token", "gen_ai.client.token.usage"):
        assert points.get(name), name
    duration = points["gen_ai.server.request.duration"][0]
    assert duration.count >= 1 and duration.attributes["gen_ai.request.model"] == "qwen"
    assert duration.attributes["gen_ai.operation.name"] == "chat" and duration.attributes["mlxd.app"] == APP
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in points["gen_ai.client.token.usage"]}
    assert tokens == {"input": usage["prompt_tokens"], "output": usage["completion_tokens"]}

    span = next(s for s in spans.get_finished_spans() if s.attributes["mlxd.request_id"] == "otel-1")
    assert span.name == "chat qwen" and span.kind.name == "SERVER"
    assert span.attributes["gen_ai.response.id"] == answer.json()["id"]
    assert span.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert span.end_time > span.start_time and span.status.is_ok


def test_a_failed_request_carries_its_error_type(observed):
    daemon, reader, spans = observed
    too_long = httpx.post(f"{daemon.url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "qwen", "prompt": "alpha beta gamma delta " * 3000, "max_tokens": 2})
    assert too_long.status_code == 400
    failed = [p for p in _points(reader)["gen_ai.server.request.duration"] if p.attributes.get("error.type") == "400"]
    assert failed and failed[0].attributes["gen_ai.operation.name"] == "text_completion"
    span = spans.get_finished_spans()[-1]
    assert span.status.status_code.name == "ERROR" and "4096" in span.status.description


def test_without_an_endpoint_there_is_no_telemetry_and_a_missing_sdk_is_a_config_error(monkeypatch, tmp_path):
    import builtins

    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}])
    with daemon_in_thread(registry, tmp_path) as plain:
        assert plain.ctx.telemetry is None
    real_import = builtins.__import__

    def no_sdk(name, *args, **kw):
        if name.startswith("opentelemetry.sdk"):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_sdk)
    with pytest.raises(ConfigError, match=r"mlxd\[otel\]"):
        Telemetry.otlp("http://127.0.0.1:4318")
