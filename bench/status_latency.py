"""How fast /v1/status (and /metrics) answer while two models generate.

Starts a real `mlxd serve` process on two models made offline (tiny by
default, `--size small` for the 0.5B-shaped ones), keeps one streaming
generation running on each, and hammers the endpoint from one keep-alive
client for `--seconds`. An idle phase (nothing generating) comes first as the
baseline. The target is a p99 under 20 ms for /v1/status under load.

    python bench/status_latency.py
    python bench/status_latency.py --size small --seconds 30

Prints a table and writes bench/results/status_latency.json. Timing only:
nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, add_dtype_option, daemon, environment, model_dtype, save, table  # noqa: E402

TARGET_P99_MS = 20.0


@dataclass
class Phase:
    name: str
    endpoint: str
    requests: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    generated_tokens_per_s: float


def models(size: str, dtype: str = "float32") -> list[dict[str, object]]:
    from mlxd.factory import ModelRecipe, build_model

    return [
        {"name": "first", "path": str(build_model(ModelRecipe("qwen2", size, seed=0, dtype=dtype)))},
        {"name": "second", "path": str(build_model(ModelRecipe("llama", size, seed=1, dtype=dtype)))},
    ]


class Generator(threading.Thread):
    """Keeps one streaming chat completion running on ``model`` until stopped."""

    def __init__(self, url: str, model: str, max_tokens: int) -> None:
        super().__init__(daemon=True, name=f"generate-{model}")
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.stop = threading.Event()
        self.chunks = 0
        self.errors = 0

    def run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": self.max_tokens, "stream": True, "temperature": 0.8}
        with httpx.Client(base_url=self.url, timeout=300) as http:
            while not self.stop.is_set():
                try:
                    with http.stream("POST", "/v1/chat/completions", json=body) as response:
                        for line in response.iter_lines():
                            if self.stop.is_set():
                                break
                            if line.startswith("data: {") and '"content"' in line:
                                self.chunks += 1
                except httpx.HTTPError:
                    self.errors += 1
                    time.sleep(0.1)


def hammer(url: str, endpoint: str, seconds: float) -> list[float]:
    latencies = []
    with httpx.Client(base_url=url, timeout=10) as http:
        http.get(endpoint)  # open the connection
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            response = http.get(endpoint)
            latencies.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def phase(name: str, url: str, endpoint: str, seconds: float, generators: list[Generator]) -> Phase:
    before = sum(g.chunks for g in generators)
    started = time.perf_counter()
    latencies = hammer(url, endpoint, seconds)
    elapsed = time.perf_counter() - started
    produced = sum(g.chunks for g in generators) - before
    return Phase(
        name=name, endpoint=endpoint, requests=len(latencies),
        p50_ms=statistics.median(latencies), p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99), max_ms=max(latencies),
        generated_tokens_per_s=produced / elapsed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase under load")
    parser.add_argument("--max-tokens", type=int, default=512)
    add_dtype_option(parser)
    args = parser.parse_args()

    # Other processes compete for the same cores: say how busy the machine was.
    load_before = environment()["load_average"]
    with daemon(models(args.size, model_dtype(args))) as url:
        for model in ("first", "second"):  # load both and warm the kernels up
            httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8})
        short = max(3.0, args.seconds / 4)
        # /health is the floor: the same HTTP stack with almost nothing to read.
        phases = [phase("idle", url, "/v1/status", short, []), phase("idle", url, "/health", short, [])]
        generators = [Generator(url, m, args.max_tokens) for m in ("first", "second")]
        for g in generators:
            g.start()
        deadline = time.monotonic() + 120
        while not all(g.chunks for g in generators) and time.monotonic() < deadline:
            time.sleep(0.1)
        phases.append(phase("2 models generating", url, "/v1/status", args.seconds, generators))
        phases.append(phase("2 models generating", url, "/health", short, generators))
        phases.append(phase("2 models generating", url, "/metrics", short, generators))
        status = httpx.get(f"{url}/v1/status").json()
        for g in generators:
            g.stop.set()
        for g in generators:
            g.join(timeout=60)

    env = environment()
    print(f"\n{args.size} models, {env['machine']}, load average {load_before:.1f} -> {env['load_average']:.1f}, "
          f"MLX {status['daemon']['mlx']['version']}, BLAS {status['daemon']['blas']['active']}")
    print(table(
        ["phase", "endpoint", "requests", "p50 ms", "p90 ms", "p99 ms", "max ms", "gen tok/s"],
        [[p.name, p.endpoint, p.requests, f"{p.p50_ms:.2f}", f"{p.p90_ms:.2f}", f"{p.p99_ms:.2f}",
          f"{p.max_ms:.2f}", f"{p.generated_tokens_per_s:.1f}"] for p in phases],
    ))
    under_load = phases[2]
    verdict = "meets" if under_load.p99_ms < TARGET_P99_MS else "misses"
    print(f"\n/v1/status p99 under load: {under_load.p99_ms:.2f} ms ({verdict} the {TARGET_P99_MS:g} ms target)")
    path = save("status_latency", args.size, {
        "environment": env,
        "load_average_before": load_before,
        "seconds": args.seconds,
        "target_p99_ms": TARGET_P99_MS,
        "status_bytes": len(json.dumps(status)),
        "phases": [asdict(p) for p in phases],
        "generator_errors": sum(g.errors for g in generators),
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
