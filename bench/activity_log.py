"""What the activity log costs the request path: building a request's row
and handing it to the writer thread (what ``record_request`` adds per
request), timed on the calling thread while the writer commits to sqlite
beside it. Also the writer's rate and the file's size per row. The target
is under 50 µs per request.

    python bench/activity_log.py [--rows 20000]

Prints a table and writes bench/results/activity_log.json. Timing only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import save, table  # noqa: E402
from mlxd.monitoring.activity import ActivityLog, ActivityRow  # noqa: E402

TARGET_US = 50.0


def one_row(i: int) -> ActivityRow:
    started = time.monotonic() - 0.25
    first = started + 0.05
    ended = time.monotonic()
    return ActivityRow(
        time=time.time(), request_id=f"req_{i:024x}", response_id=f"chatcmpl-{i:024x}", key="key:3f2a9c1d",
        model="qwen", target="qwen", surface="chat", stream=True, status=200, tokens_in=812, tokens_cached=790,
        tokens_out=64, ttft_seconds=round(first - started, 4), tokens_per_second=round(63 / (ended - first), 2),
        duration_seconds=round(ended - started, 4), finish_reason="stop", error=None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxd-activity-") as tmp:
        log = ActivityLog(Path(tmp))
        log.start()
        costs = []
        began = time.perf_counter()
        for i in range(args.rows):
            t0 = time.perf_counter_ns()
            log.add(one_row(i))
            costs.append((time.perf_counter_ns() - t0) / 1000)
            if i % 50 == 0:
                time.sleep(0.0005)  # requests arrive apart: let the writer run between them
        log.flush(timeout=120)
        written_in = time.perf_counter() - began
        size = os.path.getsize(log.path) + sum(
            os.path.getsize(p) for p in Path(tmp).glob("activity.sqlite3-*")
        )
        t0 = time.perf_counter()
        rows = log.query(limit=100)
        query_ms = (time.perf_counter() - t0) * 1000
        log.stop()
    costs.sort()
    result = {
        "rows": args.rows,
        "per_request_us_p50": round(statistics.median(costs), 2),
        "per_request_us_p99": round(costs[int(len(costs) * 0.99)], 2),
        "per_request_us_max": round(costs[-1], 2),
        "writer_rows_per_second": round(args.rows / written_in),
        "bytes_per_row": round(size / args.rows, 1),
        "query_latest_100_ms": round(query_ms, 2),
        "queried": len(rows),
        "target_us": TARGET_US,
        "load": os.getloadavg(),
    }
    print(table(["figure", "value"], [[k, v] for k, v in result.items()]))
    print(f"wrote {save('activity_log', 'default', result)}")


if __name__ == "__main__":
    main()
