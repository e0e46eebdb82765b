"""Usage per app and model outlives a restart: the activity log's sqlite
sums it as rows are written, and keeps the sums when it prunes the rows.
``mlxd status`` shows it, for the admin and for an app's own key."""

from __future__ import annotations

import time

from rich.console import Console

from mlxd.cli.status import render
from mlxd.monitoring.activity import ActivityBounds, ActivityLog, ActivityRow, Counted
from mlxd.monitoring.usage import UsageBook


def row(app: str, model: str, status: int = 200, tokens: tuple[int, int, int] = (10, 4, 5), at: float = 0.0):
    return ActivityRow(time=at or time.time(), request_id="r", response_id="c", key=app, model=model, target=model,
                       surface="chat", stream=False, status=status, tokens_in=tokens[0], tokens_cached=tokens[1],
                       tokens_out=tokens[2], ttft_seconds=None, tokens_per_second=None, duration_seconds=0.1,
                       finish_reason="stop", error=None)


def restarted(tmp_path, rows, bounds: ActivityBounds = ActivityBounds()) -> tuple[ActivityLog, UsageBook]:
    """``rows`` written by one run; the log and the usage the next run reads back."""
    first = ActivityLog(tmp_path, bounds)
    first.start()
    for r in rows:
        first.add(r)
    assert first.flush()
    first.stop()
    again = ActivityLog(tmp_path)
    book = UsageBook()
    book.restore(again.usage_totals())
    return again, book


def test_usage_totals_survive_a_restart_and_the_pruning_of_rows(tmp_path):
    again, book = restarted(tmp_path, (
        row("editor", "a"), row("editor", "a", 429, (0, 0, 0)), row("rag", "e", tokens=(7, 0, 0)),
        row("editor", "a", tokens=(1, 0, 2), at=time.time() - 2 * 86400)), ActivityBounds(max_rows=2, prune_every=1))
    assert book.rows() == [
        {"app": "editor", "model": "a", "requests": 3, "errors": 1, "tokens_in": 11, "tokens_cached": 4,
         "tokens_out": 7},
        {"app": "rag", "model": "e", "requests": 1, "errors": 0, "tokens_in": 7, "tokens_cached": 0, "tokens_out": 0},
    ]
    assert len(again.query(limit=10)) <= 2, "rows were pruned; the sums stayed"


def test_embeddings_are_kept_without_an_activity_row_and_a_refused_key_is_nobodys_usage(tmp_path):
    again, book = restarted(tmp_path, (
        Counted("rag", "minilm", 200, 12), Counted("rag", "minilm", 403), row("-", "a", 401, (0, 0, 0))))
    assert book.rows() == [
        {"app": "rag", "model": "minilm", "requests": 2, "errors": 1, "tokens_in": 12, "tokens_cached": 0,
         "tokens_out": 0},
    ]
    assert [r["status"] for r in again.query(limit=10)] == [401], "the activity log keeps generation requests"


def test_the_tokens_a_caller_spent_since_a_time_are_read_back_for_its_day_limit(tmp_path):
    log = ActivityLog(tmp_path)
    log.start()
    for r in (row("editor", "a"), row("editor", "b", tokens=(1, 0, 2)), row("editor", "a", at=time.time() - 86400),
              row("rag", "e", tokens=(7, 0, 0)), Counted("rag", "minilm", 200, 30),
              Counted("rag", "minilm", 200, 500, time=time.time() - 86400)):
        log.add(r)
    assert log.flush()
    log.stop()
    assert dict(log.tokens_since(time.time() - 3600)) == {"editor": 18, "rag": 37}, "embeddings count too"


def test_mlxd_status_shows_usage_for_an_apps_key():
    doc = {
        "schema_version": 1, "daemon": {"version": "x", "uptime_seconds": 5, "draining": False},
        "app": {"name": "editor", "priority": "interactive", "models": ["coder*"], "routes": ["generation"]},
        "models": [], "events": [],
        "usage": [{"app": "editor", "model": "coder", "requests": 3, "errors": 1, "tokens_in": 120,
                   "tokens_cached": 64, "tokens_out": 42}],
    }
    console = Console(width=100, record=True)
    console.print(render(doc, 100))
    text = console.export_text()
    assert "app editor · interactive · models coder*" in text
    assert "editor  coder" in text and "120" in text and "64" in text and "42" in text
