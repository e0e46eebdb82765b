"""``mlxd log``: the activity log, one line per request, newest last;
``-f`` keeps following it. Failures are one line on stderr and exit status 1."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from mlxd.cli.client import DaemonClient
from mlxd.errors import MlxdError


def line(row: dict[str, Any]) -> str:
    """One row as a terminal line: when, who, what, how it went, what it cost."""
    when = datetime.fromtimestamp(row["time"]).strftime("%Y-%m-%d %H:%M:%S")
    cached = f" ({row['tokens_cached']} cached)" if row["tokens_cached"] else ""
    ttft = f" ttft {row['ttft_seconds']:.2f}s" if row["ttft_seconds"] is not None else ""
    if row.get("queued_seconds"):  # (absent from an older daemon's rows)
        ttft = f" queued {row['queued_seconds']:.2f}s{ttft}"
    rate = f" {row['tokens_per_second']:.1f} tok/s" if row["tokens_per_second"] is not None else ""
    target = f"->{row['target']}" if row["target"] and row["target"] != row["model"] else ""
    outcome = row["finish_reason"] or ""
    if row["error"]:
        outcome = f"{outcome} error: {row['error']}".strip()
    return (
        f"{when} {row['status']} {row['model']}{target} {row['surface']} {row['key']}"
        f" in {row['tokens_in']}{cached} out {row['tokens_out']}{ttft}{rate}"
        f" {row['duration_seconds']:.2f}s {outcome} [{row['request_id']}]"
    )


def run_log(
    *, url: str | None, api_key: str | None, config: Path | None, follow: bool, limit: int,
    model: str | None, errors: bool, as_json: bool, interval: float = 1.0,
    echo: Callable[[str], None] = print, rounds: int | None = None,
) -> int:
    client = DaemonClient.discover(url=url, api_key=api_key, config=config, timeout=10.0)
    filters = {k: v for k, v in {"model": model, "errors": "true" if errors else None}.items() if v}
    show = (lambda row: echo(json.dumps(row))) if as_json else (lambda row: echo(line(row)))
    try:
        answer = client.get("/v1/activity?" + urlencode({**filters, "limit": limit}))
        if answer.get("problem"):
            # No rows because there is no log: not "no requests yet".
            raise MlxdError(answer["problem"])
        rows = answer["data"]
        for row in reversed(rows):
            show(row)
        last = rows[0]["id"] if rows else 0
        while follow and (rounds is None or rounds > 0):
            time.sleep(interval)
            rounds = None if rounds is None else rounds - 1
            newer = client.get("/v1/activity?" + urlencode({**filters, "after": last, "limit": 1000}))["data"]
            for row in newer:
                show(row)
                last = row["id"]
    except KeyboardInterrupt:
        return 0
    except MlxdError as exc:
        print(f"mlxd: error: {exc.message}", file=sys.stderr)
        return 1
    return 0
