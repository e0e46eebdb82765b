"""The last hour, in memory: one sample every few seconds of what the
dashboard charts. Per model, the output tokens per busy second (speed, not
use), the queue and the leases, time to first token p50/p95 and the
prompt tokens the prefix cache served; for the daemon, the memory committed
against the budget.

A fixed-length ring (``span / step`` samples) of small tuples: its memory is
bounded by the number of models, whatever the traffic
(``bench/history_memory.py``). ``sample()`` is called by one periodic task;
``request_finished()`` by the request path (an append). Event loop only."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from mlxd.monitoring.metrics import ThroughputWindow
from mlxd.residency.shell import ManagerSnapshot

# Finished requests' first-token times kept per step and model for the
# percentiles; beyond this the step's percentiles are of its first ones.
MAX_TTFTS_PER_STEP = 512


class ModelSample(NamedTuple):
    tokens: int
    busy_seconds: float
    queued: int
    active: int
    ttft_p50: float | None
    ttft_p95: float | None
    cached_tokens: int
    requests: int


class Sample(NamedTuple):
    at: float
    committed_bytes: int
    budget_bytes: int
    models: dict[str, ModelSample]


@dataclass
class _Step:
    """What the request path reported since the last sample, per model."""

    ttfts: list[float]
    cached_tokens: int = 0
    requests: int = 0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class History:
    def __init__(
        self, throughput: ThroughputWindow, step_seconds: float = 5.0, span_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.step_seconds = step_seconds
        self.span_seconds = span_seconds
        self._throughput = throughput
        self._clock = clock
        self._samples: deque[Sample] = deque(maxlen=max(1, int(span_seconds / step_seconds)))
        self._step: dict[str, _Step] = {}
        # Each model's tokens and busy seconds at the previous sample.
        self._last_totals: dict[str, tuple[int, float]] = {}

    def request_finished(self, model: str, ttft_seconds: float | None, cached_tokens: int) -> None:
        step = self._step.get(model)
        if step is None:
            step = self._step[model] = _Step([])
        step.requests += 1
        step.cached_tokens += cached_tokens
        if ttft_seconds is not None and len(step.ttfts) < MAX_TTFTS_PER_STEP:
            step.ttfts.append(ttft_seconds)

    def sample(self, manager: ManagerSnapshot) -> Sample:
        models = {}
        for view in manager.models:
            name = view.name
            tokens, busy = self._throughput.totals(name)
            before_tokens, before_busy = self._last_totals.get(name, (tokens, busy))
            self._last_totals[name] = (tokens, busy)
            step = self._step.pop(name, None) or _Step([])
            models[name] = ModelSample(
                tokens=tokens - before_tokens, busy_seconds=round(busy - before_busy, 3),
                queued=view.queued, active=view.active,
                ttft_p50=percentile(step.ttfts, 0.5), ttft_p95=percentile(step.ttfts, 0.95),
                cached_tokens=step.cached_tokens, requests=step.requests,
            )
        self._step.clear()  # models removed by a reload
        sample = Sample(round(self._clock(), 3), manager.committed, manager.budget, models)
        self._samples.append(sample)
        return sample

    def __len__(self) -> int:
        return len(self._samples)

    def since(self, after: float | None = None) -> list[Sample]:
        """The samples newer than ``after`` (a copy: ``columns`` may then run
        on another thread while sampling goes on)."""
        return [s for s in self._samples if after is None or s.at > after]

    def document(self, after: float | None = None) -> dict[str, Any]:
        return self.columns(self.since(after))

    def columns(self, samples: list[Sample]) -> dict[str, Any]:
        """Samples as columns, ready to chart: ``t`` and ``committed_bytes``
        per sample, and per model one list per figure (null where the model
        did not exist yet or had no value)."""
        names: list[str] = []
        for s in samples:
            names += [n for n in s.models if n not in names]
        models = {}
        for name in names:
            rows = [s.models.get(name) for s in samples]
            models[name] = {
                "tokens_per_second": [_rate(r) for r in rows],
                "tokens": [r.tokens if r else None for r in rows],
                "busy_seconds": [r.busy_seconds if r else None for r in rows],
                "queued": [r.queued if r else None for r in rows],
                "active": [r.active if r else None for r in rows],
                "ttft_p50_seconds": [r.ttft_p50 if r else None for r in rows],
                "ttft_p95_seconds": [r.ttft_p95 if r else None for r in rows],
                "cached_tokens": [r.cached_tokens if r else None for r in rows],
                "requests": [r.requests if r else None for r in rows],
            }
        return {
            "object": "history",
            "step_seconds": self.step_seconds,
            "span_seconds": self.span_seconds,
            "t": [s.at for s in samples],
            "committed_bytes": [s.committed_bytes for s in samples],
            "budget_bytes": [s.budget_bytes for s in samples],
            "models": models,
        }


def _rate(row: ModelSample | None) -> float | None:
    """Tokens per busy second within the step; null when the model was idle."""
    if row is None or row.busy_seconds <= 0:
        return None
    return round(row.tokens / row.busy_seconds, 2)
