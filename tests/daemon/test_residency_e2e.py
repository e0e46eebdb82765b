"""Residency with real tiny models: three models, a budget that holds two,
observed through /v1/models, /v1/status and the admin endpoints."""

import json
import logging
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.daemon import (
    Daemon,
    daemon_in_thread,
    free_port,
    holding_the_worker,
    tiny_model,
    wait_until,
    write_registry,
)

from mlxd.daemon.build import build_daemon
from mlxd.registry.loader import load_registry
from mlxd.settings import DaemonSettings

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "List the files in the folder"}]
# Each model is charged 10 MB (its real footprint is smaller, so the learned
# measurement never changes the arithmetic); the budget holds two of them.
EACH = {"estimated_memory_gb": 0.01}
# A stream that is surely still running when the test acts on it.
LONG = {"ignore_eos": True}


def ask(daemon, model, max_tokens=4, **kw):
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": CHAT, "max_tokens": max_tokens, **kw},
        timeout=60,
    )


def states(daemon):
    return {m["id"]: m["state"] for m in httpx.get(f"{daemon.url}/v1/models").json()["data"]}


@pytest.fixture
def three_models(tmp_path):
    registry = write_registry(
        tmp_path,
        [
            {"name": "a", "model": "qwen", **EACH},
            {"name": "b", "model": "llama", **EACH},
            {"name": "c", "model": "qwen-b", **EACH},
        ],
        manager={"memory_budget": "25MB"},
    )
    with daemon_in_thread(registry, tmp_path) as d:
        yield d


def test_lazy_load_then_lru_eviction_when_a_third_model_is_asked_for(three_models):
    d = three_models
    assert set(states(d).values()) == {"unloaded"}
    assert ask(d, "a").status_code == 200
    assert ask(d, "b").status_code == 200
    assert states(d) == {"a": "loaded", "b": "loaded", "c": "unloaded"}
    assert ask(d, "a").status_code == 200  # a is now more recently used than b
    assert ask(d, "c").status_code == 200
    assert states(d) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
    evictions = [e for e in d.status()["events"] if e["kind"] == "evict"]
    assert evictions and evictions[-1]["model"] == "b"
    assert "make room for c" in evictions[-1]["message"]
    assert d.model("b")["load_count"] == 1
    assert ask(d, "b").status_code == 200  # reloads transparently
    assert d.model("b")["load_count"] == 2
    assert d.status()["memory"]["committed_bytes"] <= d.status()["memory"]["budget_bytes"]


def test_a_model_in_use_is_never_evicted(three_models):
    d = three_models
    ask(d, "a")
    body = {"model": "b", "messages": CHAT, "max_tokens": 400, "stream": True, **LONG}
    started = threading.Event()
    outcome = {}

    def long_stream():
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                started.set()
            outcome["status"] = r.status_code

    t = threading.Thread(target=long_stream)
    t.start()
    started.wait(30)
    assert ask(d, "c").status_code == 200  # a is idle and goes; b is streaming and stays
    t.join(60)
    assert outcome["status"] == 200
    evicted = [e["model"] for e in d.status()["events"] if e["kind"] == "evict"]
    assert evicted == ["a"]


def test_admin_load_and_unload(three_models):
    d = three_models
    r = httpx.post(f"{d.url}/v1/models/c/load", json={}, timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "loaded"
    assert states(d)["c"] == "loaded"
    r = httpx.post(f"{d.url}/v1/models/c/unload", json={}, timeout=60)
    assert r.status_code == 200 and r.json()["state"] == "unloaded"
    assert states(d)["c"] == "unloaded"
    assert httpx.post(f"{d.url}/v1/models/zzz/load", json={}).status_code == 404


def test_idle_unload_after_the_configured_seconds(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen", "idle_unload_seconds": 1}])
    with daemon_in_thread(registry, tmp_path) as d:
        assert ask(d, "a").status_code == 200
        status = d.model("a")
        assert status["state"] == "loaded" and status["idle_unload_at"] is not None
        wait_until(lambda: d.model("a")["state"] == "unloaded", timeout=15)
        unloads = [e for e in d.status()["events"] if e["kind"] == "unload" and e["model"] == "a"]
        assert "idle" in unloads[-1]["message"]
        assert ask(d, "a").status_code == 200


def test_preload_and_pinned(tmp_path):
    registry = write_registry(
        tmp_path,
        [
            {"name": "a", "model": "qwen", "preload": True, "pinned": True, "idle_unload_seconds": 1, **EACH},
            {"name": "b", "model": "llama", **EACH},
            {"name": "c", "model": "qwen-b", **EACH},
        ],
        manager={"memory_budget": "25MB"},
    )
    with daemon_in_thread(registry, tmp_path) as d:
        assert states(d)["a"] == "loaded", "preloaded before serving"
        ask(d, "b")
        ask(d, "c")  # must evict b, never the pinned a
        assert states(d) == {"a": "loaded", "b": "unloaded", "c": "loaded"}


def test_failed_preload_marks_the_model_failed_and_the_others_serve(tmp_path):
    # An architecture this mlx-lm does not know: valid files, failing load.
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model("qwen"), broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "qwen99"}))
    registry = write_registry(
        tmp_path,
        [
            {"name": "broken", "path": str(broken), "preload": True, "estimated_memory_gb": 0.01},
            {"name": "a", "model": "qwen"},
        ],
    )
    with daemon_in_thread(registry, tmp_path) as d:
        status = d.model("broken")
        assert status["state"] == "failed" and status["failures"] == 1 and status["last_error"]
        r = ask(d, "broken")
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "model_load_failed"
        assert "Traceback" not in r.text
        assert ask(d, "a").status_code == 200
        health = httpx.get(f"{d.url}/health").json()
        assert health["status"] == "degraded"


def test_capacity_failure_is_503_with_retry_after(tmp_path):
    registry = write_registry(
        tmp_path,
        [{"name": "a", "model": "llama", **EACH}, {"name": "b", "model": "qwen", **EACH}],
        manager={"memory_budget": "15MB", "contention_policy": {"strategy": "fail"}},
    )
    with daemon_in_thread(registry, tmp_path) as d:
        body = {"model": "a", "messages": CHAT, "max_tokens": 3000, "stream": True, **LONG}
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the stream
            next(lines)
            blocked = ask(d, "b")
            assert blocked.status_code == 503
            assert blocked.json()["error"]["code"] == "insufficient_memory"
            assert int(blocked.headers["retry-after"]) >= 1


def test_preemption_ends_the_victims_stream_with_an_error_and_done(tmp_path):
    registry = write_registry(
        tmp_path,
        [{"name": "a", "model": "llama", **EACH}, {"name": "b", "model": "qwen", **EACH}],
        manager={"memory_budget": "15MB", "contention_policy": {"strategy": "preempt"}},
    )
    with daemon_in_thread(registry, tmp_path) as d:
        body = {"model": "a", "messages": CHAT, "max_tokens": 3000, "stream": True, **LONG}
        frames = []
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            frames.append(next(lines))
            result = {}
            t = threading.Thread(target=lambda: result.update(r=ask(d, "b")))
            t.start()
            frames.extend(line for line in lines if line)
            t.join(60)
        assert frames[-1] == "data: [DONE]"
        assert '"code":"preempted"' in frames[-2]
        assert result["r"].status_code == 200
        assert any(e["kind"] == "preempt" and e["model"] == "a" for e in d.status()["events"])


def test_a_fairness_drain_whose_waiter_gave_up_leaves_the_busy_model_loaded(tmp_path):
    # b's request drains a after 0.5 s (max_pass_over_s) and gives up with 503
    # at 1.5 s (wait_timeout_s) while a is still streaming: a must go back to
    # serving, not be unloaded for nobody when its stream ends.
    registry = write_registry(
        tmp_path,
        [{"name": "a", "model": "llama", "max_concurrency": 2, **EACH}, {"name": "b", "model": "qwen", **EACH}],
        manager={
            "memory_budget": "15MB",
            "max_pass_over_s": 0.5,
            "contention_policy": {"strategy": "wait_then_fail", "wait_timeout_s": 1.5},
        },
    )
    with daemon_in_thread(registry, tmp_path) as d:
        body = {"model": "a", "messages": CHAT, "max_tokens": 3000, "stream": True, **LONG}
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            next(lines)
            blocked = ask(d, "b")
            assert blocked.status_code == 503
            assert blocked.json()["error"]["code"] == "insufficient_memory"
            assert any(e["kind"] == "drain" and e["model"] == "a" for e in d.status()["events"])
            assert d.model("a")["state"] == "loaded"
            assert ask(d, "a").status_code == 200, "a admits requests again while the stream runs"
        # The client hung up: its lease ends as the stream would have.
        wait_until(lambda: d.model("a")["active_leases"] == 0, timeout=15)
        assert d.model("a")["state"] == "loaded"
        assert not [e for e in d.status()["events"] if e["model"] == "a" and e["kind"] in ("unload", "evict")]


def test_a_model_measured_above_the_whole_budget_is_a_problem_an_operator_sees(tmp_path):
    # The footprint a load measured is remembered across restarts; one above
    # the whole budget turns every request away, which no retry changes: the
    # daemon is degraded, and says which model and what to change.
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen", **EACH}, {"name": "b", "model": "llama", **EACH}],
                              manager={"memory_budget": "25MB"})
    with daemon_in_thread(registry, tmp_path) as d:
        assert ask(d, "a").status_code == 200
    remembered = tmp_path / "state" / "footprints.json"
    footprints = json.loads(remembered.read_text())
    (key,) = [k for k in footprints if "qwen" in k]
    remembered.write_text(json.dumps({**footprints, key: 40 << 20}))
    with daemon_in_thread(registry, tmp_path) as d:
        refused = ask(d, "a")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "model_too_large"
        assert ask(d, "b").status_code == 200
        status = httpx.get(f"{d.url}/v1/status").json()["health"]
        assert status["status"] == "degraded"
        assert status["problems"] == [
            "model `a` needs 40.0 MB (measured), more than the whole memory budget of 25.0 MB: it cannot load; "
            "raise manager.memory_budget, or lower its max_context or max_concurrency"
        ]
        health = httpx.get(f"{d.url}/health").json()
        assert health["status"] == "degraded"
        assert health["reasons"] == ["1 model(s) need more than the whole memory budget"]
        # What an alert rule reads: the problem's count, and the footprint against the budget.
        metrics = dict(line.rsplit(" ", 1) for line in httpx.get(f"{d.url}/metrics").text.splitlines()
                       if line and not line.startswith("#"))
        assert float(metrics["mlxd_health_problems"]) == 1
        assert float(metrics['mlxd_model_measured_bytes{model="a"}']) == 40 << 20
        assert float(metrics["mlxd_memory_budget_bytes"]) == 25 << 20


def test_a_stop_during_a_load_does_not_wait_for_the_load_to_finish(tmp_path, caplog):
    """SIGTERM while a model loads: the daemon went on to warm it up and
    restore its cache, reported it loaded, and only then unloaded it, so
    a stop soon after a start waited for all of that (past launchd's and
    systemd's kill timeout with a large model)."""
    caplog.set_level(logging.INFO, logger="mlxd.residency")
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    port = free_port()
    settings = DaemonSettings(config=registry, port=port, state_dir=tmp_path / "state", watch_config=False)
    built = build_daemon(settings, load_registry(registry))
    thread = threading.Thread(target=built.server.run, name="test-daemon", daemon=True)
    thread.start()
    wait_until(lambda: built.server.started, timeout=30)
    daemon = Daemon(url=f"http://127.0.0.1:{port}", ctx=built.ctx)
    with ThreadPoolExecutor(2) as pool:
        _, gate = holding_the_worker(daemon, pool)  # the load waits for the worker
        pool.submit(httpx.post, f"{daemon.url}/v1/models/a/load", json={}, timeout=60)
        wait_until(lambda: states(daemon)["a"] == "loading")
        built.server.handle_exit(signal.SIGTERM, None)
        try:
            wait_until(lambda: "load of a stopped" in caplog.text, timeout=10)
        finally:
            gate.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert "loaded a in" not in caplog.text
