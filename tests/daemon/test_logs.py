"""The daemon's log is written by a thread of its own: a stderr that reads
slowly (a full pipe to launchd or journald) never stalls the code that logs,
and nothing logged before the daemon ends is lost."""

from __future__ import annotations

import io
import json
import logging
import threading
import time

import pytest

from mlxd.daemon.logs import configure_logging


class GatedStream(io.StringIO):
    """A stream whose writes wait until ``gate`` opens, as a full pipe does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def write(self, text: str) -> int:
        self.gate.wait(10)
        return super().write(text)


@pytest.fixture
def restore_root():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_blocked_stderr_does_not_block_the_caller_and_loses_nothing(restore_root) -> None:
    stream = GatedStream()
    writer = configure_logging("text", "info", stream=stream)
    log = logging.getLogger("mlxd.requests")
    started = time.monotonic()
    for i in range(200):
        log.info("request %d done", i)
    assert time.monotonic() - started < 1.0  # the writes are still waiting on the gate
    stream.gate.set()
    writer.close()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(": ", 1)[1] for line in lines] == [f"request {i} done" for i in range(200)]


def test_json_lines_keep_the_exception_apart_and_render_arguments_when_logged(restore_root) -> None:
    stream = io.StringIO()
    with configure_logging("json", "info", stream=stream):
        log = logging.getLogger("mlxd")
        payload = {"state": "before"}
        try:
            raise ValueError("bad weights")
        except ValueError:
            log.exception("loading %s failed", payload)
        payload["state"] = "after"  # changed once the call returned: the line says what was logged
    record = json.loads(stream.getvalue().splitlines()[0])
    assert record["message"] == "loading {'state': 'before'} failed"
    assert record["level"] == "error" and record["logger"] == "mlxd"
    assert "ValueError: bad weights" in record["exception"]
    assert "Traceback" not in record["message"]


def test_levels_below_the_configured_one_are_dropped(restore_root) -> None:
    stream = io.StringIO()
    with configure_logging("text", "warning", stream=stream):
        logging.getLogger("mlxd").info("quiet")
        logging.getLogger("mlxd").warning("loud")
    assert "loud" in stream.getvalue() and "quiet" not in stream.getvalue()
