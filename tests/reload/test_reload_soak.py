"""Soak: several clients keep two models busy while models.yaml is rewritten
over and over (live changes, reloads, models added and removed, an invalid
file). No request for a model that stays registered may fail."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from reload.harness import CHAT, registry_doc, reloading_daemon, replace_atomically

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

TRAFFIC_SECONDS = 12.0
CLIENTS = 4

A = {"name": "a", "model": "qwen", "max_concurrency": 2}
B = {"name": "b", "model": "llama", "max_concurrency": 2}
C = {"name": "c", "model": "qwen-b"}

# Each step is what the file says next; the b path changes are counted to
# bound how many loads of b may happen.
STEPS: list[tuple[str, list[dict] | None, dict]] = [
    ("ttl", [{**A, "idle_unload_seconds": 120}, B], {}),
    ("add c", [{**A, "idle_unload_seconds": 120}, B, C], {}),
    ("b path", [{**A, "idle_unload_seconds": 120}, {**B, "model": "qwen-b"}, C], {}),
    ("alias + remove c", [{**A, "aliases": ["first"]}, {**B, "model": "qwen-b"}], {}),
    ("invalid", None, {}),
    ("a max_context", [{**A, "max_context": 2048}, {**B, "model": "qwen-b"}], {}),
    ("budget", [{**A, "max_context": 2048}, {**B, "model": "qwen-b"}], {"memory_budget": "1500MB"}),
    ("b path back", [{**A, "max_context": 2048}, B], {"memory_budget": "1500MB"}),
    ("back to start", [A, B], {}),
]


@dataclass
class Tally:
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, failure: str | None) -> None:
        with self.lock:
            if failure is None:
                self.ok += 1
            else:
                self.failures.append(failure)


def one_request(http: httpx.Client, model: str, stream: bool) -> str | None:
    """None when the request succeeded, else what went wrong."""
    body = {"model": model, "messages": CHAT, "max_tokens": 12, "stream": stream}
    if not stream:
        response = http.post("/v1/chat/completions", json=body)
        ok = response.status_code == 200 and response.json()["choices"][0]["finish_reason"] in ("length", "stop")
        return None if ok else f"{model}: {response.status_code} {response.text[:200]}"
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return f"{model} stream: {response.status_code} {response.read()[:200]!r}"
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    frames = [json.loads(line[6:]) for line in lines[:-1]]
    # Parsed, not grepped: a generated token can itself be the word "error".
    if lines[-1:] != ["data: [DONE]"] or any("error" in frame for frame in frames):
        return f"{model} stream ended badly: {lines[-2:]}"
    finish = [frame["choices"][0].get("finish_reason") for frame in frames[1:]]
    return None if finish[-1] in ("length", "stop") else f"{model} stream finish {finish[-1]}"


def client(url: str, seed: int, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(seed)
    with httpx.Client(base_url=url, timeout=60) as http:
        while not stop.is_set():
            model, stream = rng.choice("ab"), rng.random() < 0.5
            try:
                tally.record(one_request(http, model, stream))
            except httpx.HTTPError as exc:
                tally.record(f"{model}: {type(exc).__name__}: {exc}")


def test_continuous_traffic_survives_continuous_edits(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A, B]))
    tally, stop = Tally(), threading.Event()
    with reloading_daemon(registry, tmp_path) as d:
        clients = [
            threading.Thread(target=client, args=(d.url, seed, stop, tally), daemon=True) for seed in range(CLIENTS)
        ]
        for t in clients:
            t.start()
        deadline = time.monotonic() + TRAFFIC_SECONDS
        b_path_changes = 0
        writes = 0
        for name, models, manager in itertools.cycle(STEPS):
            if time.monotonic() > deadline:
                break
            text = "models: [oops\n" if models is None else registry_doc(tmp_path, models, manager=manager)
            if writes % 2:
                registry.write_text(text)
            else:
                replace_atomically(registry, text)
            writes += 1
            b_path_changes += name.startswith("b path")
            # Long enough for the watcher to settle on most steps, short
            # enough that some edits land while a reload is in progress.
            time.sleep(random.Random(writes).uniform(0.25, 0.6))
        stop.set()
        for t in clients:
            t.join(timeout=60)
        generation = d.config()["generation"]
        loads_of_b = d.factory.count("b")
        status = d.status()
    assert tally.failures == [], tally.failures[:5]
    # Liveness only: how many requests fit in the time depends on the machine.
    assert tally.ok >= 10 * CLIENTS, "the clients were not busy"
    assert writes >= len(STEPS) and generation >= 4, (writes, generation)
    assert loads_of_b <= 1 + b_path_changes, "a reload must never load a model twice"
    assert all(m["active_leases"] == 0 for m in status["models"])
