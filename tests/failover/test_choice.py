"""The failover choice as a table: each row is the targets' states (as the
router reads them from residency and the backend poll) and the order a
request tries them in."""

from __future__ import annotations

import pytest

from mlxd.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    BadRequest,
    CapacityUnavailable,
    ClientDisconnected,
    ModelLoadFailed,
    ModelNotFound,
    QueueFull,
    RequestTimeout,
    ShuttingDown,
    UpstreamRejected,
)
from mlxd.failover.choice import Target, falls_through, order


def local(name="local", state="unloaded", busy=0, waiting=0, capacity=1):
    return Target(name, "local", state, None, busy, waiting, capacity)


def mlxd(name="studio:big", state=None, reachable=True, busy=0, waiting=0, capacity=8):
    return Target(name, "mlxd", state, reachable, busy, waiting, capacity)


def openai(name="gpu:big", reachable=True, busy=0, waiting=0, capacity=4):
    return Target(name, "openai", None, reachable, busy, waiting, capacity)


ROWS = [
    # warm: whoever has the model loaded, else the file's order.
    ("warm", [local(state="loaded"), mlxd(state="loaded")], ["local", "studio:big"]),
    ("warm", [local(state="unloaded"), mlxd(state="loaded")], ["studio:big", "local"]),
    ("warm", [local(state="loading"), mlxd(state="unloaded")], ["local", "studio:big"]),
    ("warm", [mlxd(state="unloaded"), local(state="loaded")], ["local", "studio:big"]),
    ("warm", [local(), mlxd(state=None)], ["local", "studio:big"]),  # not reported: not known to be warm
    ("warm", [local(state="draining"), mlxd(state="loaded")], ["studio:big", "local"]),
    # An OpenAI server serves only what it has loaded: warm when it answers.
    ("warm", [local(), openai()], ["gpu:big", "local"]),
    ("warm", [local(), openai(reachable=None)], ["local", "gpu:big"]),
    # warm does not look at capacity: a busy warm target queues the request.
    ("warm", [local(state="loaded", busy=1, waiting=3), mlxd(state="loaded")], ["local", "studio:big"]),
    # spillover: the first target with a free slot.
    ("spillover", [local(busy=0), mlxd()], ["local", "studio:big"]),
    ("spillover", [local(busy=1), mlxd()], ["studio:big", "local"]),
    ("spillover", [local(busy=0, waiting=1), mlxd()], ["studio:big", "local"]),  # someone queues already
    ("spillover", [local(busy=1, capacity=2), mlxd()], ["local", "studio:big"]),
    ("spillover", [local(busy=1), mlxd(busy=8)], ["local", "studio:big"]),  # all full: the file's order
    ("spillover", [local(state="unloaded"), mlxd(state="loaded")], ["local", "studio:big"]),  # warmth aside
    ("spillover", [mlxd(busy=6, waiting=2), openai(busy=1), local()], ["gpu:big", "local", "studio:big"]),
    # A target that looks down goes last, whatever the strategy.
    ("warm", [mlxd(state="loaded", reachable=False), local()], ["local", "studio:big"]),
    ("spillover", [local(state="failed"), mlxd(busy=8)], ["studio:big", "local"]),
    ("warm", [local(state="failed"), mlxd(reachable=False)], ["local", "studio:big"]),  # all down: file order
    ("spillover", [mlxd(reachable=None), local()], ["studio:big", "local"]),  # not polled yet is not down
    # A model the mlxd backend reports failed is down although the backend answers.
    ("warm", [mlxd(state="failed"), local(state="unloaded")], ["local", "studio:big"]),
    ("spillover", [mlxd(state="failed"), local(busy=1)], ["local", "studio:big"]),
]


@pytest.mark.parametrize(("strategy", "targets", "expected"), ROWS)
def test_the_order_a_request_tries_the_targets_in(strategy, targets, expected):
    assert order(strategy, targets) == expected


@pytest.mark.parametrize(
    ("error", "passes"),
    [
        (BackendUnavailable("connection refused"), True),
        (BackendFailed("Backend `studio` failed (503)"), True),
        (BackendTimeout("no answer within 600 s"), True),
        (UpstreamRejected(429, "queue full"), True),
        (QueueFull("too many queued"), True),
        (ModelLoadFailed("cannot be loaded: corrupt weights"), True),
        (CapacityUnavailable("does not fit"), True),
        # The request itself is wrong, or there is no time or nobody left.
        (UpstreamRejected(400, "max_tokens is too large"), False),
        (UpstreamRejected(404, "model does not exist"), False),
        (BadRequest("bad image"), False),
        (RequestTimeout("timed out"), False),
        (ClientDisconnected("gone"), False),
        (ShuttingDown("shutting down"), False),
        (ModelNotFound("x", []), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_which_failures_let_the_next_target_try(error, passes):
    assert falls_through(error) is passes
