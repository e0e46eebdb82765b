"""Prometheus metrics, in a registry of the app's own (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mlxd_requests", "Generation requests by model and HTTP status", ["model", "status"], registry=self.registry
        )
        self.tokens = Counter("mlxd_tokens", "Tokens processed", ["model", "direction"], registry=self.registry)
        self.request_seconds = Histogram(
            "mlxd_request_seconds", "Request duration", ["model"], registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
