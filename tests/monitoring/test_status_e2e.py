"""/v1/status, /health and /metrics of a real daemon on tiny real models,
followed through real state changes: load, use, idle unload, eviction, a
failed load and a reload of an invalid config file."""

from __future__ import annotations

import os
import re

import httpx
import pytest
from monitoring.monitoring_support import chat, corrupt_model, sample, scrape
from reload.harness import reloading_daemon
from support.daemon import daemon_in_thread, wait_until, write_registry

from mlxd.cli.status import idle_countdown
from mlxd.monitoring.status import PREFIX_CACHE_FIELDS, SCHEMA_VERSION
from mlxd.errors import ConfigError

pytestmark = pytest.mark.mlx

EPOCH_2020 = 1_577_836_800


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitoring")
    registry = write_registry(
        tmp,
        [
            {"name": "qwen", "model": "qwen", "aliases": ["default"], "idle_unload_seconds": 1},
            {"name": "llama", "model": "llama", "max_concurrency": 2},
            {"name": "broken", "path": str(corrupt_model(tmp))},
        ],
    )
    with daemon_in_thread(registry, tmp) as d:
        yield d


def model(doc, name):
    return next(m for m in doc["models"] if m["name"] == name)


def test_every_registered_model_is_listed_with_its_configuration(daemon):
    doc = daemon.status()
    assert doc["schema_version"] == SCHEMA_VERSION == 1
    assert [m["name"] for m in doc["models"]] == ["qwen", "llama", "broken"]
    qwen = model(doc, "qwen")
    assert qwen["aliases"] == ["default"] and qwen["idle_unload_seconds"] == 1
    assert model(doc, "llama")["max_concurrency"] == 2
    assert model(doc, "llama")["idle_unload_seconds"] == 900  # the manager default
    for m in doc["models"]:
        assert m["memory"]["estimated_bytes"] > m["memory"]["weights_bytes"] > 0
        assert set(m["prefix_cache"]) == set(PREFIX_CACHE_FIELDS)
    d = doc["daemon"]
    assert d["pid"] == os.getpid()  # the daemon runs in this test process
    assert d["bind"]["port"] == int(daemon.url.rsplit(":", 1)[1])
    assert d["mlx"]["version"] and "cpu" in d["mlx"]["device"].lower()
    assert d["auth_required"] is False and d["metrics_enabled"] is True
    assert 0 <= d["uptime_seconds"] < 600 and d["started_at"] > EPOCH_2020
    assert doc["config"]["path"].endswith("models.yaml") and len(doc["config"]["file_hash"]) == 64
    assert doc["config"]["generation"] == 1
    memory = doc["memory"]
    assert memory["budget_bytes"] == 2 << 30
    assert memory["system_total_bytes"] >= memory["system_available_bytes"] > 0
    assert memory["process_rss_bytes"] > 0
    assert memory["mlx"]["active_bytes"] is not None


def test_an_admin_load_shows_in_state_memory_events_and_metrics(daemon):
    before = daemon.status()
    assert model(before, "llama")["state"] == "unloaded"
    assert model(before, "llama")["loaded_at"] is None
    response = httpx.post(f"{daemon.url}/v1/models/llama/load", json={}, timeout=60)
    assert response.status_code == 200
    doc = daemon.status()
    llama = model(doc, "llama")
    assert llama["state"] == "loaded"
    assert llama["load_count"] == 1 and llama["last_load_seconds"] > 0
    assert doc["generated_at"] >= llama["loaded_at"] > before["generated_at"]
    assert llama["memory"]["measured_bytes"] > 0
    assert llama["memory"]["reserved_bytes"] == llama["memory"]["estimated_bytes"]
    assert doc["memory"]["committed_bytes"] == sum(m["memory"]["reserved_bytes"] for m in doc["models"])
    assert doc["memory"]["free_bytes"] == doc["memory"]["budget_bytes"] - doc["memory"]["committed_bytes"]
    assert llama["engine"]["kind"] == "text"
    assert any(e["kind"] == "load" and e["model"] == "llama" and "loaded llama in" in e["message"]
               for e in doc["events"])
    metrics = scrape(daemon)
    assert sample(metrics, "mlxd_model_loads_total", model="llama") == 1
    assert sample(metrics, "mlxd_model_load_seconds_count", model="llama") == 1
    assert sample(metrics, "mlxd_model_state", model="llama", state="loaded") == 1
    assert sample(metrics, "mlxd_model_state", model="llama", state="unloaded") == 0
    assert sample(metrics, "mlxd_model_resident_bytes", model="llama") == llama["memory"]["reserved_bytes"]
    assert sample(metrics, "mlxd_memory_committed_bytes") == doc["memory"]["committed_bytes"]


def test_using_a_model_counts_requests_tokens_and_recent_throughput(daemon):
    before = model(daemon.status(), "llama")
    # ignore_eos: a sampled answer may end early (it made 15 of the 19 tokens in one full run).
    first = chat(daemon, "llama", max_tokens=12, ignore_eos=True)
    second = chat(daemon, "llama", max_tokens=7, stream=True, ignore_eos=True)
    assert first.status_code == second.status_code == 200
    usage = first.json()["usage"]
    llama = model(daemon.status(), "llama")
    assert llama["requests"] == before["requests"] + 2
    assert llama["tokens_out"] == before["tokens_out"] + 12 + 7
    assert llama["tokens_in"] == before["tokens_in"] + 2 * usage["prompt_tokens"]
    # Streamed and non-streamed output both count toward the 60 s window.
    assert llama["recent_output_tokens"] == before["recent_output_tokens"] + 19
    assert llama["recent_tokens_per_second"] == pytest.approx(llama["recent_output_tokens"] / 60, abs=1e-3)
    assert llama["last_used_at"] >= llama["loaded_at"]
    assert llama["active_leases"] == 0 and llama["queued"] == 0
    # The prefix-cache figures are the engine's own, under the documented names.
    reported = llama["engine"].get("prefix_cache") or {}
    assert llama["prefix_cache"] == {key: reported.get(key) for key in PREFIX_CACHE_FIELDS}
    metrics = scrape(daemon)
    assert sample(metrics, "mlxd_requests_total", model="llama", status="200") >= 2
    assert sample(metrics, "mlxd_tokens_total", model="llama", direction="out") == llama["tokens_out"]
    assert sample(metrics, "mlxd_time_to_first_token_seconds_count", model="llama") >= 2
    assert sample(metrics, "mlxd_request_seconds_count", model="llama") >= 2
    assert sample(metrics, "mlxd_model_recent_tokens_per_second", model="llama") == pytest.approx(
        llama["recent_output_tokens"] / 60, abs=0.05
    )
    # "How close am I to the budget, and what is really allocated?": the cache's share and MLX's own count.
    assert llama["prefix_cache"]["memory_bytes"] > 0
    assert sample(metrics, "mlxd_prefix_cache_bytes", model="llama") == llama["prefix_cache"]["memory_bytes"]
    assert sample(metrics, "mlxd_memory_mlx_active_bytes") > 0 and sample(metrics, "mlxd_process_rss_bytes") > 0
    # Between-turn prefills, as /v1/status has them (none: its template moves nothing).
    for figure in ("next_turn_prefills", "next_turn_tokens"):
        assert sample(metrics, f"mlxd_prefix_cache_{figure}_total", model="llama") == llama["prefix_cache"][figure] == 0


def test_a_lease_in_use_shows_as_active_and_pauses_the_idle_countdown(daemon):
    body = {"model": "llama", "messages": [{"role": "user", "content": "List the files in the folder"}],
            "max_tokens": 3000, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(lines)
        busy = model(daemon.status(), "llama")
        assert busy["active_leases"] == 1
        assert busy["idle_unload_at"] is None and busy["idle_unload_in_seconds"] is None
        assert scrape(daemon)[("mlxd_model_active_leases", frozenset({("model", "llama")}))] == 1
    wait_until(lambda: model(daemon.status(), "llama")["active_leases"] == 0, timeout=10)
    idle = model(daemon.status(), "llama")
    assert 0 < idle["idle_unload_in_seconds"] <= 900
    assert idle["idle_unload_at"] == pytest.approx(idle["last_used_at"] + 900, abs=1)


def test_idle_unload_counts_down_then_unloads_and_says_why(daemon):
    assert chat(daemon, "default").status_code == 200  # the alias reaches qwen
    loaded = model(daemon.status(), "qwen")
    if loaded["state"] == "loaded":  # not already unloaded by a slow machine
        assert loaded["idle_unload_at"] == pytest.approx(loaded["last_used_at"] + 1, abs=0.05)
        assert 0 <= loaded["idle_unload_in_seconds"] <= 1
    wait_until(lambda: model(daemon.status(), "qwen")["state"] == "unloaded", timeout=15)
    doc = daemon.status()
    qwen = model(doc, "qwen")
    assert qwen["memory"]["reserved_bytes"] == 0 and qwen["loaded_at"] is None
    assert qwen["idle_unload_at"] is None and qwen["load_count"] >= 1
    unload = [e for e in doc["events"] if e["kind"] == "unload" and e["model"] == "qwen"][-1]
    assert "idle for" in unload["message"] and "idle_unload_seconds=1" in unload["message"]
    # The unload is counted in the same step that marks the model unloaded.
    metrics = scrape(daemon)
    # By cause, a small fixed set: "why was it unloaded?" is answered per model.
    assert sample(metrics, "mlxd_model_unloads_total", model="qwen", cause="idle") == 1
    assert sample(metrics, "mlxd_model_evictions_total", model="qwen") is None
    assert sample(metrics, "mlxd_model_state", model="qwen", state="unloaded") == 1


def test_a_failed_load_is_reported_sanitized_and_degrades_health(daemon):
    response = chat(daemon, "broken")
    assert response.status_code == 503
    # One sentence for people, not our exception class's name in front of it.
    assert "ModelLoadFailed" not in response.text and "Model `broken` failed to load: The model" in response.text
    doc = daemon.status()
    broken = model(doc, "broken")
    assert broken["state"] == "failed" and broken["failures"] >= 1
    assert broken["last_error"].startswith("The model `broken` could not be loaded")
    for secret in ("Traceback", "broken-model", "embed_tokenZ", "\n"):
        assert secret not in broken["last_error"]
    assert broken["retry_at"] > doc["generated_at"]
    assert broken["memory"]["reserved_bytes"] == 0
    assert any(e["kind"] == "failure" and e["model"] == "broken" for e in doc["events"])
    assert doc["health"]["status"] == "degraded"
    assert any("`broken` failed to load" in p for p in doc["health"]["problems"])
    health = httpx.get(f"{daemon.url}/health")
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and health.json()["models"]["failed"] == 1
    assert "broken" not in health.text, "/health names no model"
    metrics = scrape(daemon)
    assert sample(metrics, "mlxd_model_load_failures_total", model="broken") >= 1
    assert sample(metrics, "mlxd_model_state", model="broken", state="failed") == 1


def test_a_rejected_reload_shows_the_error_and_degrades_health_until_the_file_is_fixed(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    good = registry.read_text()
    with reloading_daemon(registry, tmp_path, watch=False) as d:
        registry.write_text(good.replace("models:", "models:\n- name: b\n  max_context: lots"))
        rejected = d.reload()
        assert rejected.status_code == 400
        doc = d.status()
        error = doc["config"]["error"]
        assert error["file"] == str(registry) and error["line"] is not None and error["message"]
        assert error["key"] == rejected.json()["error"]["key"]
        assert doc["config"]["last_reload"]["outcome"] == "invalid" and doc["config"]["generation"] == 1
        assert any(e["kind"] == "reload" and "rejected" in e["message"] for e in doc["events"])
        assert doc["health"] == {"status": "degraded", "problems": [f"the configuration file is invalid: {error_line(error)}"]}
        health = httpx.get(f"{d.url}/health")
        assert health.json()["status"] == "degraded"
        assert health.json()["reasons"] == ["the configuration file on disk is invalid"]
        assert str(registry) not in health.text and "max_context" not in health.text
        assert sample(scrape(d), "mlxd_config_error") == 1

        registry.write_text(good)
        assert d.reload().status_code == 200
        doc = d.status()
        assert doc["config"]["error"] is None and doc["health"]["status"] == "ok"
        assert httpx.get(f"{d.url}/health").json()["status"] == "ok"
        assert sample(scrape(d), "mlxd_config_error") == 0


def error_line(error: dict) -> str:
    return str(ConfigError(error["message"], file=error["file"], line=error["line"], key=error["key"]))


def test_status_answers_while_a_model_generates(daemon):
    body = {"model": "llama", "messages": [{"role": "user", "content": "List the files in the folder"}],
            "max_tokens": 3000, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{daemon.url}/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        next(lines)
        with httpx.Client(base_url=daemon.url, timeout=5) as http:
            answers = [http.get("/v1/status") for _ in range(20)]
    assert all(a.status_code == 200 for a in answers)
    assert answers[-1].json()["models"][1]["active_leases"] == 1


def test_eviction_is_an_event_with_its_reason_and_a_counted_metric(tmp_path):
    each = {"estimated_memory_gb": 0.01}  # the 15 MB budget holds one model
    registry = write_registry(
        tmp_path,
        [{"name": "a", "model": "qwen", **each}, {"name": "b", "model": "llama", **each}],
        manager={"memory_budget": "15MB"},
    )
    with daemon_in_thread(registry, tmp_path) as d:
        assert chat(d, "a").status_code == 200
        assert chat(d, "b").status_code == 200
        doc = d.status()
        assert model(doc, "a")["state"] == "unloaded" and model(doc, "b")["state"] == "loaded"
        evict = [e for e in doc["events"] if e["kind"] == "evict"]
        assert [e["model"] for e in evict] == ["a"]
        message = evict[0]["message"]
        assert "evicted to make room for b" in message and "least recently used" in message
        # Why `a` is not in memory stays on its entry, whatever the events ring forgets since.
        left = model(doc, "a")["last_unload"]
        assert left["cause"] == "evicted" and message.endswith(left["reason"]) and left["at"] <= doc["generated_at"]
        assert idle_countdown(model(doc, "a")) == "evicted" and model(doc, "b")["last_unload"] is None
        assert re.search(r"needed 0\.01 GB, a idle \d+ s", message), message
        metrics = scrape(d)
        assert sample(metrics, "mlxd_model_evictions_total", model="a") == 1
        assert sample(metrics, "mlxd_model_unloads_total", model="a", cause="evicted") == 1
        assert sample(metrics, "mlxd_model_evictions_total", model="b") is None
        assert sample(metrics, "mlxd_memory_budget_bytes") == 15 << 20
