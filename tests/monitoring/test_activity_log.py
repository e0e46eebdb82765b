"""The activity log: one row per finished request, in sqlite under the state
directory, bounded, surviving restarts; served at /v1/activity and printed
by `mlxd log` (-f follows)."""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from dataclasses import replace

import httpx
import pytest
from monitoring.monitoring_support import chat
from support.daemon import daemon_in_thread, wait_until, write_registry

from mlxd.cli.activity import run_log
from mlxd.monitoring.activity import COLUMNS, ActivityBounds, ActivityLog, ActivityRow

ADMIN = "sk-admin-activity"
READER = "sk-reader-activity"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_READER = {"Authorization": f"Bearer {READER}"}


def _row(model: str = "qwen", status: int = 200, at: float | None = None, request_id: str = "req_1") -> ActivityRow:
    return ActivityRow(
        time=at if at is not None else time.time(), request_id=request_id, response_id="chatcmpl-1", key="local",
        model=model, target=model, surface="chat", stream=True, status=status, tokens_in=10, tokens_cached=4,
        tokens_out=5, ttft_seconds=0.1, tokens_per_second=50.0, duration_seconds=0.2, finish_reason="stop",
        error=None if status == 200 else "boom",
    )


def test_rows_survive_a_restart_and_filter_by_model_and_errors(tmp_path):
    log = ActivityLog(tmp_path)
    log.start()
    log.add(_row("qwen"))
    log.add(_row("llama", status=503, request_id="req_2"))
    assert log.flush()
    log.stop()

    again = ActivityLog(tmp_path)
    again.start()
    try:
        rows = again.query()
        assert [r["model"] for r in rows] == ["llama", "qwen"], "newest first"
        assert rows[1]["stream"] is True and rows[1]["tokens_cached"] == 4
        assert [r["request_id"] for r in again.query(errors_only=True)] == ["req_2"]
        assert [r["model"] for r in again.query(model="qwen")] == ["qwen"]
        assert [r["request_id"] for r in again.query(after=rows[1]["id"])] == ["req_2"]
    finally:
        again.stop()


def test_the_log_is_bounded_by_rows_and_by_age(tmp_path):
    log = ActivityLog(tmp_path, ActivityBounds(max_age_seconds=3600, max_rows=50, prune_every=10))
    log.start()
    try:
        log.add(_row(at=time.time() - 7200, request_id="too-old"))
        for i in range(120):
            log.add(_row(request_id=f"req_{i}"))
        assert log.flush()
        rows = log.query(limit=1000)
        # Pruned every 10 rows written: never more than 50 plus one batch.
        assert 50 <= len(rows) <= 60
        assert rows[0]["request_id"] == "req_119"
        assert all(r["request_id"] != "too-old" for r in rows)
    finally:
        log.stop()


def test_a_model_name_sqlite_cannot_store_is_kept_escaped_and_the_writer_goes_on(tmp_path):
    # Valid JSON ("\ud800") gives a lone surrogate, which UTF-8 cannot encode:
    # it used to end the writer thread, and every later row with it.
    log = ActivityLog(tmp_path)
    log.start()
    try:
        log.add(_row("qwen-\ud800", status=400, request_id="odd"))
        log.add(_row("qwen", request_id="after"))
        assert log.flush()
        assert [r["model"] for r in log.query()] == ["qwen", "qwen-\\ud800"]
        log.add(_row("qwen", request_id="later"))
        assert log.flush() and log.query()[0]["request_id"] == "later"
        assert {(app, model) for app, model, *_ in log.usage_totals()} == {("local", "qwen"), ("local", "qwen-\\ud800")}
    finally:
        log.stop()


def test_a_log_an_earlier_version_wrote_gains_the_new_columns_and_keeps_its_rows(tmp_path):
    old_columns = [c for c in COLUMNS if c != "queued_seconds"]
    db = sqlite3.connect(tmp_path / "activity.sqlite3")
    db.execute(f"CREATE TABLE activity (id INTEGER PRIMARY KEY AUTOINCREMENT, {', '.join(old_columns)})")
    old = dict(_row(request_id="old").as_dict(0))
    db.execute(f"INSERT INTO activity ({', '.join(old_columns)}) VALUES ({', '.join('?' for _ in old_columns)})",
               [old[c] for c in old_columns])
    db.commit()
    db.close()
    log = ActivityLog(tmp_path)
    log.start()
    try:
        log.add(replace(_row(request_id="new"), queued_seconds=1.5))
        assert log.flush() and log.failed is None
        rows = {r["request_id"]: r for r in log.query()}
        assert rows["old"]["queued_seconds"] is None and rows["old"]["tokens_out"] == 5
        assert rows["new"]["queued_seconds"] == 1.5
    finally:
        log.stop()


def test_an_unusable_state_directory_is_reported_and_the_log_is_off(tmp_path):
    blocker = tmp_path / "state"
    blocker.write_text("a file where a directory should be")
    log = ActivityLog(blocker)
    log.start()
    log.add(_row())
    assert log.failed is not None and "activity log" in log.failed
    assert log.query() == []


def test_a_damaged_log_is_set_aside_and_a_new_one_begins(tmp_path, caplog):
    """A state directory copied mid-write or hit by a disk error: the daemon
    served on with the log off (an empty `mlxd log`, usage totals lost) at
    every start, until someone found the file and deleted it by hand."""
    (tmp_path / "activity.sqlite3").write_bytes(b"not sqlite " * 400)
    log = ActivityLog(tmp_path)
    with caplog.at_level("WARNING", logger="mlxd.activity"):
        log.start()
    try:
        log.add(_row(request_id="after-the-damage"))
        assert log.flush()
        assert log.failed is None
        assert [r["request_id"] for r in log.query()] == ["after-the-damage"]
        [aside] = tmp_path.glob("activity.sqlite3.damaged-*")
        assert aside.read_bytes().startswith(b"not sqlite") and aside.name in caplog.text
    finally:
        log.stop()


def test_a_log_sqlite_cannot_open_leaves_the_daemon_serving(tmp_path, capsys):
    """Reading the usage totals at start raised from sqlite's connect (outside
    the readers' try): the daemon stopped with a traceback instead of serving
    with the log off."""
    (tmp_path / "state" / "activity.sqlite3").mkdir(parents=True)  # sqlite cannot open it
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen"}])
    with daemon_in_thread(registry, tmp_path) as d:
        assert httpx.get(f"{d.url}/v1/models").status_code == 200
        assert httpx.get(f"{d.url}/v1/activity").json()["problem"].startswith("the activity log at")
        # mlxd log says so, rather than print nothing and exit 0 as if no request had come in.
        code = run_log(url=d.url, api_key=None, config=None, follow=False, limit=5, model=None,
                       errors=False, as_json=False)
    assert code == 1
    assert "mlxd: error: the activity log at" in capsys.readouterr().err


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("activity")
    registry = write_registry(tmp, [{"name": "qwen", "model": "qwen"}], server={"read_only_keys": [READER]})
    with daemon_in_thread(registry, tmp, api_keys=ADMIN) as d:
        yield d


def _activity(daemon, headers=AS_ADMIN, **params) -> list[dict]:
    return httpx.get(f"{daemon.url}/v1/activity", params=params, headers=headers).json()["data"]


@pytest.mark.mlx
def test_a_finished_request_is_a_row_with_its_figures(daemon):
    answer = chat(daemon, "qwen", max_tokens=6, headers={**AS_ADMIN, "X-Request-Id": "find-me"}, temperature=0)
    assert answer.status_code == 200
    usage = answer.json()["usage"]
    row = wait_until(lambda: next(iter(_activity(daemon, request_id="find-me")), None), timeout=2)
    assert row["model"] == "qwen" and row["surface"] == "chat" and row["status"] == 200
    assert row["response_id"] == answer.json()["id"] and row["key"].startswith("key:") and ADMIN not in str(row)
    assert (row["tokens_in"], row["tokens_out"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert row["finish_reason"] == answer.json()["choices"][0]["finish_reason"] and row["error"] is None
    assert 0 < row["ttft_seconds"] <= row["duration_seconds"]
    assert row["tokens_per_second"] > 0

    # A streamed request that the client cut short is a row too, with its error.
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", headers={**AS_ADMIN, "X-Request-Id": "cut"},
                      json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
                            "stream": True, "ignore_eos": True}) as stream:
        lines = stream.iter_lines()
        for _ in range(4):
            next(lines)
    cut = wait_until(lambda: next(iter(_activity(daemon, request_id="cut")), None), timeout=5)
    assert cut["status"] == 499 and cut["error"] == "client disconnected" and cut["stream"] is True
    assert 0 < cut["tokens_out"] < 2000


@pytest.mark.mlx
def test_a_request_that_waited_for_its_model_to_load_says_how_long_it_queued(daemon, caplog):
    """"Why was that request slow?": its row and its log line split the
    wait for the model (here, its load) from prefill and decoding."""
    caplog.set_level(logging.INFO, logger="mlxd.requests")
    assert httpx.post(f"{daemon.url}/v1/models/qwen/unload", json={}, headers=AS_ADMIN).status_code == 200
    assert chat(daemon, "qwen", max_tokens=3, headers={**AS_ADMIN, "X-Request-Id": "cold"}).status_code == 200
    assert chat(daemon, "qwen", max_tokens=3, headers={**AS_ADMIN, "X-Request-Id": "warm"}).status_code == 200
    cold = wait_until(lambda: next(iter(_activity(daemon, request_id="cold")), None), timeout=2)
    warm = wait_until(lambda: next(iter(_activity(daemon, request_id="warm")), None), timeout=2)
    load = httpx.get(f"{daemon.url}/v1/status", headers=AS_ADMIN).json()["models"][0]["last_load_seconds"]
    assert load <= cold["queued_seconds"] <= cold["ttft_seconds"] <= cold["duration_seconds"]
    assert 0 <= warm["queued_seconds"] < load
    line = next(r.getMessage() for r in caplog.records if "request_id=cold" in r.getMessage())
    logged = dict(re.findall(r" (queued|ttft)=([0-9.]+)", line))
    assert float(logged["queued"]) == pytest.approx(cold["queued_seconds"], abs=2e-3), line
    assert float(logged["ttft"]) == pytest.approx(cold["ttft_seconds"], abs=2e-3), line


@pytest.mark.mlx
def test_a_read_only_key_reads_only_its_own_rows(daemon):
    assert chat(daemon, "qwen", max_tokens=2, headers={**AS_READER, "X-Request-Id": "reader-1"}).status_code == 200
    wait_until(lambda: _activity(daemon, request_id="reader-1"), timeout=2)
    mine = _activity(daemon, headers=AS_READER)
    assert [r["request_id"] for r in mine] == ["reader-1"]
    assert len(_activity(daemon)) > 1


@pytest.mark.mlx
def test_mlxd_log_prints_the_latest_and_follows(daemon, capsys):
    chat(daemon, "qwen", max_tokens=3, headers={**AS_ADMIN, "X-Request-Id": "printed-1"})
    wait_until(lambda: _activity(daemon, request_id="printed-1"), timeout=2)
    printed: list[str] = []

    def later() -> None:
        chat(daemon, "qwen", max_tokens=3, headers={**AS_ADMIN, "X-Request-Id": "followed-1"})

    threading.Timer(0.3, later).start()
    code = run_log(url=daemon.url, api_key=ADMIN, config=None, follow=True, limit=5, model="qwen", errors=False,
                   as_json=False, interval=0.5, echo=printed.append, rounds=8)
    assert code == 0
    first = next(i for i, p in enumerate(printed) if "[printed-1]" in p)
    followed = next(i for i, p in enumerate(printed) if "[followed-1]" in p)
    assert first < followed and " 200 qwen chat key:" in printed[followed], printed
    wrong = run_log(url=daemon.url, api_key="wrong", config=None, follow=False, limit=5, model=None,
                    errors=False, as_json=False)
    assert wrong == 1
    assert "mlxd: error: 401" in (err := capsys.readouterr().err) and "(pass --api-key or set MLXD_API_KEY)" in err


@pytest.mark.mlx
def test_requests_refused_before_planning_are_rows_with_their_error(daemon):
    url = f"{daemon.url}/v1/chat/completions"
    ask = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refusals = {
        "no-key": httpx.post(url, json=ask, headers={"X-Request-Id": "no-key"}),
        "bad-body": httpx.post(url, json={**ask, "temperature": "hot"},
                               headers={**AS_ADMIN, "X-Request-Id": "bad-body"}),
        "no-model": httpx.post(url, json={**ask, "model": "nope", "stream": True},
                               headers={**AS_ADMIN, "X-Request-Id": "no-model"}),
        "too-many": httpx.post(url, json={**ask, "max_tokens": 10**9},
                               headers={**AS_ADMIN, "X-Request-Id": "too-many"}),
        "messages": httpx.post(f"{daemon.url}/v1/messages", json={"model": "qwen", "max_tokens": 2, "messages": "x"},
                               headers={"x-api-key": READER, "X-Request-Id": "messages"}),
        # A lone surrogate (valid JSON) in the model name: its row is written, and the rows after it.
        "surrogate": httpx.post(url, content='{"model": "qwen-\\ud800", "messages": []}',
                                headers={**AS_ADMIN, "X-Request-Id": "surrogate", "content-type": "application/json"}),
    }
    for rid, answer in refusals.items():
        assert answer.status_code >= 400, (rid, answer.text)
        row = wait_until(lambda rid=rid: next(iter(_activity(daemon, request_id=rid)), None), timeout=2)
        assert row["status"] == answer.status_code and row["tokens_in"] == row["tokens_out"] == 0, rid
        assert row["error"] == answer.json()["error"]["message"] and row["finish_reason"] is None, rid
    rows = {rid: _activity(daemon, request_id=rid)[0] for rid in refusals}
    assert rows["no-key"]["key"] == "-" and rows["no-key"]["model"] == ""  # its body was never read
    assert rows["bad-body"]["model"] == "qwen" and rows["bad-body"]["key"].startswith("key:")
    # A name no entry answers to is counted as one: its message names it.
    assert rows["no-model"]["model"] == "(unknown)" and "`nope`" in rows["no-model"]["error"]
    assert rows["no-model"]["stream"] is True
    assert rows["messages"]["surface"] == "messages" and rows["messages"]["status"] == 400
    # Its own key reads it; a request that failed once planned (past its
    # deadline) has its one row, not two.
    assert [r["request_id"] for r in _activity(daemon, headers=AS_READER, request_id="messages")] == ["messages"]
    late = {**ask, "max_tokens": 8000, "ignore_eos": True, "timeout": 0.3}
    planned = httpx.post(url, json=late, headers={**AS_ADMIN, "X-Request-Id": "planned"}, timeout=60)
    assert planned.status_code == 504
    wait_until(lambda: _activity(daemon, request_id="planned"), timeout=2)
    time.sleep(0.2)
    assert [r["status"] for r in _activity(daemon, request_id="planned")] == [504]


@pytest.mark.mlx
def test_made_up_model_names_do_not_grow_the_usage_table(daemon):
    url = f"{daemon.url}/v1/chat/completions"
    for i in range(40):
        body = {"model": f"made-up-{i}", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(url, json=body, headers={**AS_ADMIN, "X-Request-Id": f"made-up-{i}"}).status_code == 404
    wait_until(lambda: _activity(daemon, request_id="made-up-39"), timeout=2)
    usage = httpx.get(f"{daemon.url}/v1/status", headers=AS_ADMIN).json()["usage"]
    models = {row["model"] for row in usage}
    assert not any(m.startswith("made-up-") for m in models) and "(unknown)" in models
    unknown = [row for row in usage if row["model"] == "(unknown)"]
    assert sum(row["requests"] for row in unknown) >= 40 and sum(row["errors"] for row in unknown) >= 40
