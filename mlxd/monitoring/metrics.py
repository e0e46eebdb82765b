"""Prometheus metrics, in a registry of the app's own (no process globals).

Counters and histograms are updated where things happen: the residency
observer hooks (loads, unloads, evictions, failures) and the request path
(requests, tokens, time to first token). Per-model gauges are computed at
scrape time by a custom collector from one snapshot of the daemon, so they
can never drift from the state they describe. Everything here runs on the event loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import psutil
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from mlxd import __version__
from mlxd.monitoring.status import SPECULATIVE_COUNTS, SPECULATIVE_FIGURES, mlx_memory_now, problems
from mlxd.residency.core import State

if TYPE_CHECKING:
    from mlxd.engine.types import GenerationChunk
    from mlxd.monitoring.snapshot import DaemonSnapshot

Clock = Callable[[], float]

LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _Busy:
    """One model's requests under way (from their first chunk to their end)
    and the moment busy time was last counted up to."""

    __slots__ = ("active", "mark")

    def __init__(self) -> None:
        self.active = 0
        self.mark = 0.0


class ThroughputWindow:
    """Output tokens per model over the last ``window_seconds``, and the
    seconds within it that the model was busy (some request under way), kept
    in one-second buckets so memory stays bounded however fast a model runs.
    Tokens over busy seconds is the model's speed; over the window, its use."""

    def __init__(self, window_seconds: float = 60.0, clock: Clock = time.monotonic) -> None:
        self.window_seconds = window_seconds
        self._clock = clock
        # model -> deque of [bucket second, tokens, busy seconds], oldest first.
        self._buckets: dict[str, deque[list[Any]]] = {}
        self._busy: dict[str, _Busy] = {}
        # model -> [tokens, busy seconds] since start (the history samples deltas).
        self._totals: dict[str, list[Any]] = {}

    def begin(self, model: str) -> None:
        """A request of ``model`` is under way."""
        busy = self._busy.setdefault(model, _Busy())
        self._count_busy(model, busy, self._clock())
        busy.active += 1

    def end(self, model: str) -> None:
        busy = self._busy.get(model)
        if busy is None or busy.active <= 0:
            return
        self._count_busy(model, busy, self._clock())
        busy.active -= 1

    def add(self, model: str, tokens: int) -> None:
        if tokens <= 0:
            return
        now = self._clock()
        busy = self._busy.get(model)
        if busy is not None:
            self._count_busy(model, busy, now)
        self._bucket(model, now)[1] += tokens
        self._totals.setdefault(model, [0, 0.0])[0] += tokens

    def tokens(self, model: str) -> int:
        """Tokens produced within the window."""
        return sum(b[1] for b in self._current(model))

    def busy_seconds(self, model: str) -> float:
        """Seconds within the window that ``model`` had a request under way."""
        busy = self._busy.get(model)
        if busy is not None:
            self._count_busy(model, busy, self._clock())
        return min(self.window_seconds, sum(b[2] for b in self._current(model)))

    def totals(self, model: str) -> tuple[int, float]:
        """Tokens and busy seconds since start, busy time counted up to now."""
        busy = self._busy.get(model)
        if busy is not None:
            self._count_busy(model, busy, self._clock())
        tokens, seconds = self._totals.get(model, (0, 0.0))
        return tokens, seconds

    def rate(self, model: str) -> float:
        """Average tokens per second over the window."""
        return self.tokens(model) / self.window_seconds

    def busy_rate(self, model: str) -> float:
        """Tokens per busy second within the window (0 when it was idle)."""
        busy = self.busy_seconds(model)
        return self.tokens(model) / busy if busy > 0 else 0.0

    def _count_busy(self, model: str, busy: _Busy, now: float) -> None:
        if busy.active > 0 and now > busy.mark:
            self._totals.setdefault(model, [0, 0.0])[1] += now - busy.mark
            # Split at second boundaries: each bucket holds its own busy time.
            start = busy.mark
            while start < now:
                edge = min(now, float(int(start) + 1))
                self._bucket(model, start)[2] += edge - start
                start = edge
        busy.mark = now

    def _bucket(self, model: str, at: float) -> list[Any]:
        second = int(at)
        buckets = self._buckets.setdefault(model, deque())
        if not buckets or buckets[-1][0] < second:
            buckets.append([second, 0, 0.0])
            self._prune(buckets, second)
        return buckets[-1]

    def _current(self, model: str) -> deque[list[Any]]:
        buckets = self._buckets.get(model)
        if not buckets:
            return deque()
        self._prune(buckets, int(self._clock()))
        return buckets

    def _prune(self, buckets: deque[list[Any]], second: int) -> None:
        oldest = second - int(self.window_seconds)
        while buckets and buckets[0][0] <= oldest:
            buckets.popleft()


class OutputMeter:
    """Watches one request's chunks as they reach the client: the first chunk
    gives the time to first token, every chunk feeds the throughput window,
    and each prompt's final chunk says whether the prefix cache helped."""

    def __init__(self, metrics: Metrics, model: str, started: float) -> None:
        self._metrics = metrics
        self._model = model
        self._started = started
        self._under_way = False
        # When its engine accepted it (its first chunk, monotonic): what came
        # before was waiting (a lease, a load, a free slot), what follows prefill.
        self.accepted_at: float | None = None
        # When the first token reached the request path (monotonic), if it did.
        self.first_token_at: float | None = None
        # Prompt tokens the prefix cache served, over the request's prompts.
        self.cached_tokens = 0
        # Chunks carry cumulative counts per prompt: remember where each was.
        self._seen: dict[Any, int] = {}

    def chunk(self, prompt_key: Any, chunk: GenerationChunk) -> None:
        if not self._under_way:
            # The first chunk (the engine's acceptance): busy from here.
            self._under_way = True
            if self.accepted_at is None:
                self.accepted_at = time.monotonic()
            self._metrics.throughput.begin(self._model)
        # An abort before any output produced no first token.
        if self.first_token_at is None and (chunk.text or chunk.completion_tokens):
            self.first_token_at = time.monotonic()
            self._metrics.first_token_seconds.labels(self._model).observe(self.first_token_at - self._started)
        previous = self._seen.get(prompt_key, 0)
        if chunk.completion_tokens > previous:
            self._metrics.throughput.add(self._model, chunk.completion_tokens - previous)
            self._seen[prompt_key] = chunk.completion_tokens
        if chunk.finish_reason and chunk.cached_tokens > 0:
            self.cached_tokens += chunk.cached_tokens
            self._metrics.prefix_cache_hits.labels(self._model).inc()
            self._metrics.tokens.labels(self._model, "cached").inc(chunk.cached_tokens)

    @property
    def tokens_out(self) -> int:
        """Tokens generated so far, over the request's prompts."""
        return sum(self._seen.values())

    def finish(self) -> None:
        """The request is over (safe to call more than once)."""
        if self._under_way:
            self._under_way = False
            self._metrics.throughput.end(self._model)


class Metrics:
    """The app's metrics. Also the residency manager's observer."""

    def __init__(self, throughput_window_seconds: float = 60.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "mlxd_requests", "Generation requests by model and HTTP status", ["model", "status"], registry=r
        )
        self.tokens = Counter(
            "mlxd_tokens", "Tokens by model and direction (in, out, cached)", ["model", "direction"], registry=r
        )
        self.loads = Counter("mlxd_model_loads", "Successful model loads", ["model"], registry=r)
        self.load_failures = Counter("mlxd_model_load_failures", "Failed model loads", ["model"], registry=r)
        self.unloads = Counter(
            "mlxd_model_unloads", "Finished unloads, evictions included, by cause (idle, evicted, budget, operator, "
            "reload, removed, shutdown, preempted, pass_over, broke)", ["model", "cause"], registry=r,
        )
        # Once the model has reloaded, neither its state nor last_error shows the failure any more.
        self.failures = Counter(
            "mlxd_model_failures", "Resident models that broke (a parallel model's rank exited or stalled)",
            ["model"], registry=r,
        )
        self.evictions = Counter(
            "mlxd_model_evictions", "Unloads made to free memory for another model", ["model"], registry=r
        )
        self.prefix_cache_hits = Counter(
            "mlxd_prefix_cache_hits", "Prompts that reused cached prefix tokens", ["model"], registry=r
        )
        self.load_seconds = Histogram(
            "mlxd_model_load_seconds", "Time to load a model", ["model"], registry=r, buckets=LOAD_BUCKETS
        )
        self.first_token_seconds = Histogram(
            "mlxd_time_to_first_token_seconds",
            "From request arrival to the first generated chunk (queueing and loading included)",
            ["model"], registry=r, buckets=FIRST_TOKEN_BUCKETS,
        )
        self.request_seconds = Histogram(
            "mlxd_request_seconds", "Request duration", ["model"], registry=r, buckets=REQUEST_BUCKETS
        )
        self.backend_requests = Counter(
            "mlxd_backend_requests", "Requests served by remote backends, by backend, model and HTTP status",
            ["backend", "model", "status"], registry=r,
        )
        self.failover_requests = Counter(
            "mlxd_failover_requests",
            "Requests on failover entries, by entry, the target that served them (or was tried last) and HTTP status",
            ["model", "target", "status"], registry=r,
        )
        self.failover_fallthroughs = Counter(
            "mlxd_failover_fallthroughs",
            "Failover targets that failed before any output, so that the next one was tried",
            ["model", "target"], registry=r,
        )
        self.encoder_inputs = Counter(
            "mlxd_embedding_inputs", "Inputs embedded or documents scored, by model", ["model"], registry=r
        )
        self.truncated_inputs = Counter(
            "mlxd_embedding_truncated_inputs", "Embedding and rerank inputs cut at the model's length, by model",
            ["model"], registry=r,
        )
        self.audio_seconds = Counter(
            "mlxd_audio_seconds", "Seconds of audio transcribed or translated (read), or synthesised (made)",
            ["model", "task"], registry=r,
        )
        self.connections_closed = Counter(
            "mlxd_connections_closed",
            "Connections the daemon closed on its client, by the bound that did it: connection_limit, "
            "header_timeout, headers_too_large, stalled (read none of its answer for send_timeout_s), "
            "shutdown (still unread when the grace ended)",
            ["reason"], registry=r,
        )
        self.app_refusals = Counter(
            "mlxd_app_refusals",
            "Requests refused before they reached a model (a limit, a scope, a bad body, an unknown model, "
            "a key), by app (- for a refused key) and HTTP status",
            ["app", "status"], registry=r,
        )
        self.throughput = ThroughputWindow(throughput_window_seconds)
        self._attached = False

    def attach(self, snapshot: Callable[[], DaemonSnapshot]) -> None:
        """Compute the gauges from ``snapshot()`` at every scrape."""
        if not self._attached:
            self.registry.register(_SnapshotGauges(snapshot))
            self._attached = True

    def meter(self, model: str, started: float) -> OutputMeter:
        return OutputMeter(self, model, started)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # --- residency observer -------------------------------------------------

    def model_loaded(self, model: str, seconds: float) -> None:
        self.loads.labels(model).inc()
        self.load_seconds.labels(model).observe(seconds)

    def model_load_failed(self, model: str, seconds: float) -> None:
        self.load_failures.labels(model).inc()

    def model_unloaded(self, model: str, cause: str, evicted: bool) -> None:
        self.unloads.labels(model, cause).inc()
        if evicted:
            self.evictions.labels(model).inc()

    def model_failed(self, model: str) -> None:
        self.failures.labels(model).inc()


# The prefix cache's between-turn figures (``stats()["prefix_cache"]``), as counters.
NEXT_TURN_FIGURES = ("next_turn_prefills", "next_turn_tokens")


class _SnapshotGauges:
    """Gauges read from a fresh snapshot when Prometheus scrapes."""

    def __init__(self, snapshot: Callable[[], DaemonSnapshot]) -> None:
        self._snapshot = snapshot

    def describe(self) -> Iterator[Metric]:
        return iter(self._families())

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        by_name = {f.name: f for f in families}
        snap = self._snapshot()
        for m in snap.manager.models:
            name = m.name
            for state in State:
                by_name["mlxd_model_state"].add_metric([name, state.value], 1.0 if m.state is state else 0.0)
            by_name["mlxd_model_resident_bytes"].add_metric([name], m.reserved)
            by_name["mlxd_model_estimated_bytes"].add_metric([name], m.spec.charge_bytes)
            if m.measured_bytes is not None:
                by_name["mlxd_model_measured_bytes"].add_metric([name], m.measured_bytes)
            by_name["mlxd_model_active_leases"].add_metric([name], m.active)
            by_name["mlxd_model_queued_requests"].add_metric([name], m.queued)
            by_name["mlxd_model_recent_tokens_per_second"].add_metric([name], snap.recent_rate(name))
            prefix = m.engine.get("prefix_cache") if isinstance(m.engine, dict) else None
            if isinstance(prefix, dict):
                if prefix.get("memory_bytes") is not None:
                    by_name["mlxd_prefix_cache_bytes"].add_metric([name], float(prefix["memory_bytes"]))
                for figure in NEXT_TURN_FIGURES:
                    if prefix.get(figure) is not None:
                        by_name[f"mlxd_prefix_cache_{figure}"].add_metric([name], float(prefix[figure]))
            speculative = m.engine.get("speculative") if isinstance(m.engine, dict) else None
            if isinstance(speculative, dict):
                by_name["mlxd_speculative_active"].add_metric([name], 1.0 if speculative.get("active") else 0.0)
                for figure in (*SPECULATIVE_FIGURES, *SPECULATIVE_COUNTS):
                    value = speculative.get(figure)
                    if value is not None:
                        by_name[f"mlxd_speculative_{figure}"].add_metric([name], float(value))
        for b in snap.backends:
            name = b.spec.name
            by_name["mlxd_backend_up"].add_metric([name], 1.0 if b.stats.reachable else 0.0)
            by_name["mlxd_backend_in_flight"].add_metric([name], b.stats.in_flight)
            by_name["mlxd_backend_errors"].add_metric([name], b.stats.errors)
            if b.stats.latency_ms is not None:
                by_name["mlxd_backend_poll_latency_seconds"].add_metric([name], b.stats.latency_ms / 1000)
        by_name["mlxd_memory_budget_bytes"].add_metric([], snap.manager.budget)
        by_name["mlxd_memory_committed_bytes"].add_metric([], snap.manager.committed)
        # What is really allocated, beside what the budget reserves (status: memory.mlx, process_rss_bytes).
        for figure, value in mlx_memory_now().items():
            if figure != "peak_bytes" and value is not None:
                by_name[f"mlxd_memory_mlx_{figure}"].add_metric([], value)
        by_name["mlxd_process_rss_bytes"].add_metric([], psutil.Process().memory_info().rss)
        by_name["mlxd_config_generation"].add_metric([], snap.config.generation)
        by_name["mlxd_config_error"].add_metric([], 1.0 if snap.config.error else 0.0)
        by_name["mlxd_draining"].add_metric([], 1.0 if snap.draining else 0.0)
        by_name["mlxd_health_problems"].add_metric([], len(problems(snap)))
        by_name["mlxd_build_info"].add_metric([__version__], 1.0)
        for a in snap.apps:
            by_name["mlxd_app_in_flight"].add_metric([a["name"]], a["in_flight"])
            for room in a["limits"]:
                by_name["mlxd_app_limit_remaining"].add_metric([a["name"], room["name"]], room["remaining"])
        for u in snap.usage:
            where = [u["app"], u["model"]]
            by_name["mlxd_app_requests"].add_metric(where, u["requests"])
            by_name["mlxd_app_errors"].add_metric(where, u["errors"])
            for kind in ("in", "cached", "out"):
                by_name["mlxd_app_tokens"].add_metric([*where, kind], u[f"tokens_{kind}"])
        return iter(families)

    @staticmethod
    def _families() -> list[GaugeMetricFamily | CounterMetricFamily]:
        model = ["model"]
        app = ["app", "model"]
        return [
            # Since the state directory began (the totals outlive restarts).
            CounterMetricFamily("mlxd_app_requests", "Requests per app and model", labels=app),
            CounterMetricFamily("mlxd_app_errors", "Requests per app and model answered with an error", labels=app),
            # ``direction`` as in mlxd_tokens_total: one label name for one meaning.
            CounterMetricFamily("mlxd_app_tokens", "Tokens per app and model: in (prompt), cached (of in), out",
                                labels=[*app, "direction"]),
            GaugeMetricFamily("mlxd_app_in_flight", "Generation and audio requests of the app under way",
                              labels=["app"]),
            GaugeMetricFamily("mlxd_app_limit_remaining",
                              "What is left of each of the app's limits now (rpm, tpm, tokens_per_day, max_concurrency)",
                              labels=["app", "limit"]),
            GaugeMetricFamily("mlxd_model_state", "1 for the model's current state, 0 for the others",
                              labels=["model", "state"]),
            GaugeMetricFamily("mlxd_model_resident_bytes", "Bytes reserved in the budget for the model",
                              labels=model),
            GaugeMetricFamily("mlxd_model_estimated_bytes", "Footprint estimated before loading", labels=model),
            GaugeMetricFamily("mlxd_model_measured_bytes", "Footprint measured at a load (remembered across restarts)",
                              labels=model),
            GaugeMetricFamily("mlxd_model_active_leases", "Requests holding the model now", labels=model),
            GaugeMetricFamily("mlxd_model_queued_requests", "Requests waiting for the model", labels=model),
            GaugeMetricFamily("mlxd_model_recent_tokens_per_second",
                              "Output tokens per second averaged over the last 60 s", labels=model),
            # Since the model was loaded (status: prefix_cache.next_turn_*).
            CounterMetricFamily("mlxd_prefix_cache_next_turn_prefills",
                                "Between-turn prefills that kept a prefix cache entry", labels=model),
            CounterMetricFamily("mlxd_prefix_cache_next_turn_tokens",
                                "Tokens prefilled between turns, not counted as prompt tokens", labels=model),
            GaugeMetricFamily("mlxd_speculative_active", "1 while the model decodes speculatively", labels=model),
            GaugeMetricFamily("mlxd_speculative_acceptance_rate", "Drafted tokens kept, of those verified",
                              labels=model),
            GaugeMetricFamily("mlxd_speculative_accepted_per_step",
                              "Tokens a sequence emits per speculative step", labels=model),
            GaugeMetricFamily("mlxd_speculative_speedup",
                              "Measured speed of speculative over plain steps (rolling window)", labels=model),
            # Since the model was loaded (status: speculative.verify_steps, drafted_tokens, accepted_tokens).
            CounterMetricFamily("mlxd_speculative_verify_steps",
                                "Speculative steps per sequence: each verified drafts", labels=model),
            CounterMetricFamily("mlxd_speculative_drafted_tokens", "Drafted tokens verified", labels=model),
            CounterMetricFamily("mlxd_speculative_accepted_tokens", "Drafted tokens kept", labels=model),
            GaugeMetricFamily("mlxd_backend_up", "1 when the backend answered its last poll", labels=["backend"]),
            GaugeMetricFamily("mlxd_backend_in_flight", "Requests on the backend now", labels=["backend"]),
            # A count since start: a counter (rate() and increase() read it; a gauge's reset looked like a drop).
            CounterMetricFamily("mlxd_backend_errors", "Requests the backend failed since start", labels=["backend"]),
            GaugeMetricFamily("mlxd_backend_poll_latency_seconds", "How long the last poll took",
                              labels=["backend"]),
            GaugeMetricFamily("mlxd_memory_budget_bytes", "The configured memory budget"),
            GaugeMetricFamily("mlxd_memory_committed_bytes", "Bytes reserved by all models"),
            GaugeMetricFamily("mlxd_memory_mlx_active_bytes",
                              "Memory held by live MLX arrays (all models, caches included)"),
            GaugeMetricFamily("mlxd_memory_mlx_cache_bytes", "Freed buffers MLX keeps for reuse"),
            GaugeMetricFamily("mlxd_process_rss_bytes", "The daemon's resident set size"),
            GaugeMetricFamily("mlxd_prefix_cache_bytes",
                              "Memory the model's prefix cache entries take (part of its reservation)", labels=["model"]),
            GaugeMetricFamily("mlxd_config_generation", "How many registries have been applied"),
            GaugeMetricFamily("mlxd_config_error", "1 while models.yaml on disk is invalid"),
            GaugeMetricFamily("mlxd_draining", "1 while the daemon drains for shutdown"),
            GaugeMetricFamily("mlxd_health_problems", "What makes the daemon degraded (/v1/status health.problems); 0 when ok"),
            GaugeMetricFamily("mlxd_build_info", "Always 1; the version is a label", labels=["version"]),
        ]
