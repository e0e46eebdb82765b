"""How much memory one hour of the dashboard's history takes: the ring
filled to its bound (720 samples at the default 5 s step) for a given number
of models, every figure set, measured with tracemalloc; and the size and
build time of the full /v1/history document. The target is a few MB.

    python bench/history_memory.py [--models 8]

Prints a table and writes bench/results/history_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import save, table  # noqa: E402
from mlxd.monitoring.history import History  # noqa: E402
from mlxd.monitoring.metrics import ThroughputWindow  # noqa: E402


@dataclass
class View:
    name: str
    queued: int
    active: int


@dataclass
class Manager:
    models: tuple
    committed: int
    budget: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=8)
    args = parser.parse_args()
    clock = [1_000_000.0]
    window = ThroughputWindow(60, clock=lambda: clock[0])
    names = [f"model-{i}" for i in range(args.models)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    history = History(window, step_seconds=5, span_seconds=3600, clock=lambda: clock[0])
    for step in range(2 * 720):  # two hours: the ring must stay at one
        for i, name in enumerate(names):
            window.begin(name)
            clock[0] += 0.001
            window.add(name, 100 + step % 7)
            window.end(name)
            for r in range(3):
                history.request_finished(name, 0.05 * (r + 1) + i / 100, cached_tokens=500 + step)
        clock[0] += 5
        manager = Manager(tuple(View(n, step % 3, step % 2) for n in names), committed=step * 1000, budget=10**10)
        history.sample(manager)
    after = tracemalloc.take_snapshot()
    # Everything allocated since: the ring, its samples and the throughput window.
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    tracemalloc.stop()
    t0 = time.perf_counter()
    document = json.dumps(history.document(), separators=(",", ":"))
    build_ms = (time.perf_counter() - t0) * 1000
    result = {
        "models": args.models,
        "samples": len(history),
        "held_bytes": held,
        "held_mb": round(held / 1e6, 2),
        "document_bytes": len(document),
        "document_build_ms": round(build_ms, 2),
        "load": os.getloadavg(),
    }
    print(table(["figure", "value"], [[k, v] for k, v in result.items()]))
    print(f"wrote {save('history_memory', f'models_{args.models}', result)}")


if __name__ == "__main__":
    main()
