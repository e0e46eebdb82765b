"""The pure parts of the metrics: the sliding throughput window (with a fake
clock), the per-request output meter, and the app-owned registries."""

from __future__ import annotations

import prometheus_client

from mlxd.monitoring.metrics import Metrics, ThroughputWindow
from mlxd.engine.types import GenerationChunk


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_averages_the_tokens_of_the_last_sixty_seconds():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    window.add("a", 30)
    clock.now += 10
    window.add("a", 90)
    assert window.tokens("a") == 120
    assert window.rate("a") == 2.0
    assert window.tokens("b") == 0 and window.rate("b") == 0.0


def test_tokens_older_than_the_window_no_longer_count():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    window.add("a", 50)
    clock.now += 30
    window.add("a", 10)
    clock.now += 31  # the first batch is now 61 s old
    assert window.tokens("a") == 10
    clock.now += 60
    assert window.tokens("a") == 0


def test_window_memory_stays_bounded_however_many_chunks_arrive():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    for i in range(10_000):
        clock.now = 1000 + i / 20  # 20 chunks a second for 500 s
        window.add("a", 1)
    # One-second buckets: the window holds the last 59 whole seconds and the current one.
    assert 20 * 59 < window.tokens("a") <= 20 * 60
    assert len(window._buckets["a"]) <= 61


def test_busy_rate_divides_by_the_seconds_a_request_was_under_way_not_by_idle_ones():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    window.begin("a")
    clock.now += 2.5
    window.add("a", 50)  # 50 tokens in 2.5 busy seconds
    window.end("a")
    clock.now += 40  # idle: the wall-clock rate drops, the model's speed does not
    assert window.busy_seconds("a") == 2.5
    assert window.busy_rate("a") == 20.0
    assert window.rate("a") == 50 / 60


def test_overlapping_requests_count_their_busy_time_once_and_a_running_one_counts_so_far():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    window.begin("a")
    clock.now += 1
    window.begin("a")  # a second request joins
    clock.now += 1
    window.end("a")
    clock.now += 1.5
    assert window.busy_seconds("a") == 3.5, "still under way: counted up to now"
    window.end("a")
    window.end("a")  # an extra end changes nothing
    clock.now += 10
    assert window.busy_seconds("a") == 3.5
    assert window.busy_rate("b") == 0.0


def test_busy_time_older_than_the_window_no_longer_counts():
    clock = FakeClock()
    window = ThroughputWindow(60, clock=clock)
    window.begin("a")
    clock.now += 100  # one long request: only the last 60 s are in the window
    assert 59 <= window.busy_seconds("a") <= 60
    window.end("a")
    clock.now += 61
    assert window.busy_seconds("a") == 0


def _chunk(completion: int, text: str = "x", finish: str | None = None, cached: int = 0) -> GenerationChunk:
    return GenerationChunk(text=text, finish_reason=finish, prompt_tokens=5, completion_tokens=completion,
                           cached_tokens=cached)


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_meter_observes_first_token_once_and_counts_each_prompts_new_tokens():
    metrics = Metrics()
    meter = metrics.meter("m", started=0.0)
    for key, completion in [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]:
        meter.chunk(key, _chunk(completion))
    meter.chunk(1, _chunk(2, text="", finish="stop"))  # the final chunk repeats the count
    assert metrics.throughput.tokens("m") == 5
    assert _value(metrics, "mlxd_time_to_first_token_seconds_count", model="m") == 1


def test_an_abort_before_any_output_is_not_a_first_token():
    metrics = Metrics()
    metrics.meter("m", started=0.0).chunk(0, _chunk(0, text="", finish="abort"))
    assert _value(metrics, "mlxd_time_to_first_token_seconds_count", model="m") is None


def test_final_chunks_with_cached_tokens_count_prefix_cache_hits():
    metrics = Metrics()
    meter = metrics.meter("m", started=0.0)
    meter.chunk(0, _chunk(3, finish="stop", cached=40))
    meter.chunk(1, _chunk(3, finish="stop", cached=0))
    assert _value(metrics, "mlxd_prefix_cache_hits_total", model="m") == 1
    assert _value(metrics, "mlxd_tokens_total", model="m", direction="cached") == 40


def test_each_app_has_its_own_registry_and_nothing_goes_to_the_global_one():
    first, second = Metrics(), Metrics()
    first.model_loaded("a", 1.5)
    first.model_unloaded("a", "evicted", evicted=True)
    first.model_unloaded("a", "idle", evicted=False)
    first.model_load_failed("c", 0.1)
    assert _value(first, "mlxd_model_loads_total", model="a") == 1
    assert _value(first, "mlxd_model_unloads_total", model="a", cause="evicted") == 1
    assert _value(first, "mlxd_model_unloads_total", model="a", cause="idle") == 1
    assert _value(first, "mlxd_model_evictions_total", model="a") == 1
    assert _value(first, "mlxd_model_load_failures_total", model="c") == 1
    assert _value(second, "mlxd_model_loads_total", model="a") is None
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("mlxd") for name in global_names)
