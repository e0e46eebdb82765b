"""The activity log: one row per finished request, in sqlite under the state
directory, so that "why was that turn slow?" can be answered after the fact
and after a restart. Bounded by age and by row count.

The request path only appends a row to an in-memory queue (a few
microseconds, ``bench/activity_log.py``); one writer thread owns the
database, commits what has queued up in one transaction and prunes now and
then. Readers open their own connection (WAL: they never wait for the
writer) and are run off the event loop by the caller."""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

from mlxd.thread_names import name_this_thread

log = logging.getLogger("mlxd.activity")

FILE_NAME = "activity.sqlite3"
# What sqlite says of a file that is not, or no longer, a sound database (not
# of one it cannot open or lock: that file is kept as it is).
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
# The key of a row whose request had no caller: its key was refused.
NO_CALLER = "-"


@dataclass(frozen=True)
class ActivityRow:
    """One request as the log keeps it. Times are epoch seconds; ``None``
    where a figure does not exist (no first token, no finish)."""

    time: float
    request_id: str
    response_id: str
    key: str
    model: str
    # The model that served it, when ``model`` is a failover entry.
    target: str
    surface: str
    stream: bool
    status: int
    tokens_in: int
    tokens_cached: int
    tokens_out: int
    ttft_seconds: float | None
    tokens_per_second: float | None
    duration_seconds: float
    finish_reason: str | None
    error: str | None
    # From arrival until its engine accepted it: waiting for its model to
    # load, for a free slot or for the budget (its prompt's tokenizing
    # included); null where nothing generates (a refusal, audio). The
    # rest of ``ttft_seconds`` is prefill.
    queued_seconds: float | None = None

    def as_dict(self, row_id: int) -> dict[str, Any]:
        out = {"id": row_id, **{f.name: getattr(self, f.name) for f in fields(self)}}
        out["stream"] = bool(self.stream)  # sqlite keeps it as 0 or 1
        return out


@dataclass(frozen=True)
class Counted:
    """A request the usage table counts that has no activity row of its own
    (an embeddings or rerank request): the fields it shares with a row."""

    key: str
    model: str
    status: int
    tokens_in: int = 0
    tokens_cached: int = 0
    tokens_out: int = 0
    time: float = field(default_factory=time.time)


COLUMNS = tuple(f.name for f in fields(ActivityRow))
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    {", ".join(COLUMNS)}
);
CREATE INDEX IF NOT EXISTS activity_time ON activity(time);
CREATE INDEX IF NOT EXISTS activity_request ON activity(request_id);
CREATE TABLE IF NOT EXISTS usage (
    app TEXT NOT NULL, model TEXT NOT NULL,
    requests INTEGER, errors INTEGER, tokens_in INTEGER, tokens_cached INTEGER, tokens_out INTEGER,
    PRIMARY KEY (app, model)
);
-- The tokens of requests with no activity row (Counted), for the day limit.
CREATE TABLE IF NOT EXISTS counted (time REAL, app TEXT, tokens INTEGER);
CREATE INDEX IF NOT EXISTS counted_time ON counted(time);
"""
# Usage per app and model (monitoring/usage.py), summed as rows are written:
# its totals outlive the rows, which are pruned by age and count.
_ADD_USAGE = """INSERT INTO usage VALUES (?, ?, 1, ?, ?, ?, ?) ON CONFLICT (app, model) DO UPDATE SET
requests = requests + 1, errors = errors + excluded.errors, tokens_in = tokens_in + excluded.tokens_in,
tokens_cached = tokens_cached + excluded.tokens_cached, tokens_out = tokens_out + excluded.tokens_out"""
_INSERT = f"INSERT INTO activity ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
# Filters a reader may pass, and the column each compares.
FILTERS = {"model": "model", "key": "key", "surface": "surface", "request_id": "request_id"}

_STOP = object()


@dataclass(frozen=True)
class ActivityBounds:
    max_age_seconds: float = 7 * 86400.0
    max_rows: int = 100_000
    # Prune every this many rows written (and at start).
    prune_every: int = 500


def _storable(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """``values`` with every string sqlite can store: a request's model
    name is the client's text, and a lone surrogate in it (valid JSON,
    ``"\\ud800"``) cannot be encoded as UTF-8; it is kept escaped."""
    return tuple(_text(v) if isinstance(v, str) else v for v in values)


def _text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _add_new_columns(db: sqlite3.Connection) -> None:
    """A log an earlier version wrote lacks the columns added since
    (``queued_seconds``): its rows read back null there."""
    have = {row[1] for row in db.execute("PRAGMA table_info(activity)")}
    with db:
        for column in COLUMNS:
            if column not in have:
                db.execute(f"ALTER TABLE activity ADD COLUMN {column}")


class ActivityLog:
    def __init__(self, state_dir: Path, bounds: ActivityBounds = ActivityBounds()) -> None:
        self.path = state_dir / FILE_NAME
        self.bounds = bounds
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._written = 0
        # Rows handed to add() (counted by its caller's thread only) and rows
        # the writer is done with (its thread only): no lock on the hot path.
        self._added = 0
        self._done = 0
        self._committed = threading.Condition()
        self.failed: str | None = None

    # --- the request path ------------------------------------------------------

    def add(self, row: ActivityRow | Counted) -> None:
        """Queue a row (or a request for the usage table alone); never
        blocks, never raises."""
        if self._thread is None:
            return
        self._added += 1
        self._queue.put(row)

    # --- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                db = self._open()
            except sqlite3.DatabaseError as exc:
                if getattr(exc, "sqlite_errorcode", None) not in _DAMAGED:
                    raise
                # A damaged file (a copy taken mid-write, a disk error) would
                # keep the log off, usage totals included, until someone
                # deleted it by hand: it is kept aside, and a new log begins.
                aside = self._set_aside()
                log.warning("the activity log at %s is damaged (%s); moved it to %s and started a new one",
                            self.path, exc, aside.name)
                db = self._open()
        except (OSError, sqlite3.Error) as exc:
            # The log is a convenience: a daemon whose state directory cannot
            # hold it still serves, and says so.
            self.failed = f"the activity log at {self.path} cannot be used: {exc}"
            log.warning("%s", self.failed)
            return
        self._thread = threading.Thread(target=self._write, args=(db,), name="mlxd-activity", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(timeout)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued row is committed (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        target = self._added
        with self._committed:
            while self._done < target and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._committed.wait(left)
        return True

    # --- the writer thread ---------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            _add_new_columns(db)
            self._prune(db)
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self) -> Path:
        """Rename the database and its WAL files to ``<name>.damaged-<time>``."""
        suffix = f".damaged-{int(time.time())}"
        for extra in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{self.path}{extra}").rename(f"{self.path}{suffix}{extra}")
        aside = self.path.with_name(self.path.name + suffix)
        self.path.rename(aside)
        return aside

    def _write(self, db: sqlite3.Connection) -> None:
        name_this_thread()
        try:
            while True:
                batch = [self._queue.get()]
                while True:  # whatever queued meanwhile goes in the same transaction
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(item is _STOP for item in batch)
                rows = [item for item in batch if item is not _STOP]
                self._commit(db, rows)
                if stop:
                    return
        finally:
            db.close()

    def _commit(self, db: sqlite3.Connection, rows: list[ActivityRow | Counted]) -> None:
        try:
            if rows:
                with db:
                    db.executemany(_INSERT, [_storable(astuple(r)) for r in rows if isinstance(r, ActivityRow)])
                    # A request whose key was refused is nobody's usage ("-").
                    db.executemany(_ADD_USAGE, [_storable((r.key, r.model, int(r.status >= 400), r.tokens_in,
                                                           r.tokens_cached, r.tokens_out))
                                                for r in rows if r.key != NO_CALLER])
                    db.executemany("INSERT INTO counted VALUES (?, ?, ?)", [
                        _storable((r.time, r.key, r.tokens_in + r.tokens_out)) for r in rows
                        if isinstance(r, Counted) and r.key != NO_CALLER and r.tokens_in + r.tokens_out])
                before = self._written
                self._written += len(rows)
                if self._written // self.bounds.prune_every != before // self.bounds.prune_every:
                    self._prune(db)
        except Exception as exc:  # noqa: BLE001 - one bad batch must not end the writer, and with it the log
            log.warning("activity log: %d rows not written: %s", len(rows), exc)
        finally:
            with self._committed:
                self._done += len(rows)
                self._committed.notify_all()

    def _prune(self, db: sqlite3.Connection) -> None:
        oldest = time.time() - self.bounds.max_age_seconds
        with db:
            db.execute("DELETE FROM activity WHERE time < ?", (oldest,))
            db.execute("DELETE FROM counted WHERE time < ?", (oldest,))
            db.execute(
                "DELETE FROM activity WHERE id <= (SELECT id FROM activity ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.bounds.max_rows,),
            )

    # --- readers (blocking: run them off the event loop) -------------------------

    def usage_totals(self) -> list[tuple[Any, ...]]:
        """Every (app, model, requests, errors, tokens_in, tokens_cached,
        tokens_out) row the log has summed (monitoring/usage.py)."""
        # (Earlier versions summed refused keys' rows too, as "-".)
        return self._select("SELECT * FROM usage WHERE app != ? ORDER BY app, model", (NO_CALLER,))

    def tokens_since(self, since: float) -> list[tuple[str, int]]:
        """Tokens (in and out) per caller in rows newer than ``since``: the
        day a tokens_per_day limit counts, after a restart."""
        return self._select(
            "SELECT key, SUM(tokens) FROM (SELECT key, tokens_in + tokens_out AS tokens FROM activity WHERE time >= ?"
            " UNION ALL SELECT app, tokens FROM counted WHERE time >= ?) GROUP BY key", (since, since))

    def query(
        self,
        *,
        limit: int = 100,
        after: int | None = None,
        errors_only: bool = False,
        **filters: str | None,
    ) -> list[dict[str, Any]]:
        """The newest rows first (``after``: only rows newer than that id,
        oldest first, for following the log)."""
        where, args = [], []
        for name, value in filters.items():
            if value:
                where.append(f"{FILTERS[name]} = ?")
                args.append(value)
        if errors_only:
            where.append("status >= 400")
        if after is not None:
            where.append("id > ?")
            args.append(after)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = "ASC" if after is not None else "DESC"
        found = self._select(
            f"SELECT id, {', '.join(COLUMNS)} FROM activity {clause} ORDER BY id {order} LIMIT ?",
            (*args, max(1, min(limit, 1000))),
        )
        return [ActivityRow(*row[1:]).as_dict(row[0]) for row in found]

    def _select(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """The rows of a read-only query; none from a log that is missing or
        cannot be read (the daemon's start reads the usage totals: a log
        sqlite cannot even open stopped the daemon with a traceback)."""
        if not self.path.exists():
            return []
        try:
            db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        except sqlite3.Error:
            return []
        try:
            return db.execute(sql, args).fetchall()
        except sqlite3.Error:
            return []
        finally:
            db.close()
