"""Log formats (readable text by default, one JSON object per line on
request), written by a thread of their own.

Every request logs a line from the event loop. Written there, each line is a
blocking write to stderr: a pipe that launchd, journald or a terminal reads
slowly stalls every request the daemon serves, and even a quick one took
about 5 % of the loop's time in a profile of eight clients embedding short
texts. So records go onto a queue (``logging.handlers.QueueHandler``: the
message is rendered in the caller, nothing else) and one listener thread
formats and writes them, in order.
"""

from __future__ import annotations

import copy
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import IO


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


class _RenderingQueueHandler(logging.handlers.QueueHandler):
    """Renders the message in the caller (its arguments may change once the
    call returns) and leaves the rest, the exception included, to the
    writer's formatter: the stock handler folds a traceback into the
    message, which would take JSON lines' ``exception`` field away."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)
        record.msg = record.getMessage()
        record.args = None
        return record


class LogWriter:
    """The listener thread that writes the daemon's log; ``close`` writes
    what is still queued and stops it (the process's last lines included)."""

    def __init__(self, handler: logging.Handler) -> None:
        self._listener = logging.handlers.QueueListener(queue.SimpleQueue(), handler)
        self.queue_handler = _RenderingQueueHandler(self._listener.queue)
        self._listener.start()

    def close(self) -> None:
        root = logging.getLogger()
        if self.queue_handler in root.handlers:
            root.removeHandler(self.queue_handler)
        self._listener.stop()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def configure_logging(fmt: str = "text", level: str = "info", stream: IO[str] | None = None) -> LogWriter:
    """Route every logger to ``stream`` (stderr) through a ``LogWriter``;
    the caller closes it when the daemon ends."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    writer = LogWriter(handler)
    root = logging.getLogger()
    root.handlers[:] = [writer.queue_handler]
    root.setLevel(level.upper())
    # uvicorn's own handlers would print everything twice.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # watchfiles logs every batch of changes at INFO; with the log file in the
    # watched folder each line would be a change of its own, forever.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    return writer
