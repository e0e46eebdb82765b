"""Failover entries end to end, on loopback with real servers: a front mlxd
whose entries name a local tiny model and the same model on a second,
real `mlxd serve` (kind: mlxd). Which target served a request is read from
the front's /v1/status, the way an operator would; the local model and the
backend's are the same seeded weights, so the text does not tell."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from monitoring.monitoring_support import corrupt_model
from monitoring.test_dashboard import _wait, browser  # noqa: F401 (a fixture)
from support.daemon import daemon_in_thread, daemon_process, wait_until, write_registry
from support.remote import killed_mid_stream, reload, sse_events, until_text, write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backend")
    registry = write_registry(tmp, [
        {"name": "tiny", "model": "qwen", "preload": True, "aliases": ["small-talk"]},
        {"name": "broken", "path": str(corrupt_model(tmp))},
    ])
    with daemon_process(registry, tmp) as daemon:
        yield daemon


class Front:
    """The front's registry file, rewritten by the tests that reload it."""

    def __init__(self, tmp, backend_url: str) -> None:
        self.tmp = tmp
        self.backends = {"studio": {"url": backend_url, "kind": "mlxd", "poll_interval_s": 1}}
        self.failovers = {
            "warm-one": {"targets": ["here", "studio:tiny"], "strategy": "warm"},
            # The backend's model by one of its aliases there.
            "by-alias": {"targets": ["here", "studio:small-talk"], "strategy": "warm"},
            "spill": {"targets": ["here", "studio:tiny"], "strategy": "spillover", "aliases": ["sp"]},
            # A backend model that answers 503 (its files are broken over there).
            "mended": {"targets": ["studio:broken", "here"], "strategy": "spillover"},
            # A long prompt does not fit the first target's context; the second's it does.
            "roomy": {"targets": ["cramped", "here"], "strategy": "spillover"},
        }
        self.path = self.write()

    def write(self):
        models = [{"name": "here", "model": "qwen", "max_concurrency": 1},
                  {"name": "cramped", "model": "qwen", "max_context": 64}]
        models += [{"name": name, **entry} for name, entry in self.failovers.items()]
        return write_front(self.tmp, self.backends, models)


@pytest.fixture(scope="module")
def front(backend, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    files = Front(tmp, backend.url + "/v1")
    with daemon_in_thread(files.path, tmp) as daemon:
        daemon.files = files
        yield daemon


def client(front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)


def ask(front, model: str, **kw):
    # Greedy: the tests read finish_reason "length", and a sampled answer may end inside 4 tokens.
    return client(front).chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0, **kw)


def failover(front, name: str) -> dict:
    return next(f for f in front.status()["failover"] if f["name"] == name)


def served_by(front, name: str) -> str:
    return failover(front, name)["recent"][-1]["target"]


def target(front, name: str, target_name: str) -> dict:
    return next(t for t in failover(front, name)["targets"] if t["name"] == target_name)


def streams_cleanly(front, model: str, messages) -> None:
    """A streamed chat through ``model``: a 200, no error frame, [DONE]."""
    stream = httpx.post(f"{front.url}/v1/chat/completions", timeout=60, json={
        "model": model, "messages": messages, "max_tokens": 4, "stream": True})
    frames = sse_events(stream)
    assert stream.status_code == 200 and frames[-1] == "[DONE]"
    assert not [f for f in frames[:-1] if "error" in f]


def unload_here(front) -> None:
    response = httpx.post(f"{front.url}/v1/models/here/unload", json={}, timeout=30)
    assert response.status_code == 200, response.text


@contextlib.contextmanager
def held(front, model: str) -> Iterator[None]:
    """A long stream holds ``model``'s only slot until the block ends (then
    the stream is closed, and the slot given back)."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{front.url}/v1/chat/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()  # kept: a dropped line iterator closes the stream
        until_text(lines)
        yield
    wait_until(lambda: front.model(model)["active_leases"] == 0)


# The backend's model by its name there, and by an alias it has there.
@pytest.mark.parametrize(("name", "remote"), [("warm-one", "studio:tiny"), ("by-alias", "studio:small-talk")])
def test_warm_prefers_the_backend_that_has_the_model_loaded_then_the_local_one_once_it_is(front, name, remote):
    unload_here(front)
    # The backend preloads; the front learns it from its poll of the backend's status.
    wait_until(lambda: target(front, name, remote)["state"] == "loaded")
    assert failover(front, name)["order"] == [remote, "here"]
    assert ask(front, name).choices[0].finish_reason == "length"
    assert served_by(front, name) == remote
    assert front.model("here")["state"] == "unloaded", "nothing was loaded here for it"
    assert httpx.post(f"{front.url}/v1/models/here/load", json={}, timeout=60).status_code == 200
    assert failover(front, name)["order"] == ["here", remote]  # both warm: the file's order
    ask(front, name)
    assert served_by(front, name) == "here"


def test_spillover_sends_a_request_elsewhere_while_the_local_model_is_busy(front):
    ask(front, "sp")
    assert served_by(front, "spill") == "here"
    with held(front, "here"):
        assert target(front, "spill", "here")["in_flight"] == 1
        assert failover(front, "spill")["order"] == ["studio:tiny", "here"]
        stream = httpx.post(f"{front.url}/v1/chat/completions", timeout=60, json={
            "model": "sp", "messages": MESSAGES, "max_tokens": 4, "stream": True})
        assert sse_events(stream)[-1] == "[DONE]"
        assert served_by(front, "spill") == "studio:tiny"
    ask(front, "spill")
    assert served_by(front, "spill") == "here"
    recent = [r["target"] for r in failover(front, "spill")["recent"][-3:]]
    assert recent == ["here", "studio:tiny", "here"]


def test_a_backend_answering_503_lets_the_next_target_serve(front):
    before = target(front, "mended", "studio:broken")["fell_through"]
    answer = ask(front, "mended")
    assert answer.choices[0].finish_reason == "length" and answer.model == "mended"
    assert served_by(front, "mended") == "here"
    broken = target(front, "mended", "studio:broken")
    assert broken["fell_through"] == before + 1
    assert "failed (503)" in broken["last_error"]
    # The backend's status now says the model failed: the next requests go
    # to `here` first instead of paying that round trip again.
    wait_until(lambda: target(front, "mended", "studio:broken")["state"] == "failed")
    assert failover(front, "mended")["order"] == ["here", "studio:broken"]
    # A stream too: the 200 comes from the target that took the request.
    streams_cleanly(front, "mended", MESSAGES)
    assert served_by(front, "mended") == "here"
    assert target(front, "mended", "studio:broken")["fell_through"] == before + 1
    metrics = httpx.get(f"{front.url}/metrics", timeout=10).text
    assert f'mlxd_failover_fallthroughs_total{{model="mended",target="studio:broken"}} {before + 1}.0' in metrics
    assert 'mlxd_failover_requests_total{model="mended",status="200",target="here"}' in metrics


def test_a_prompt_too_long_for_one_target_goes_to_one_it_fits(front):
    long = [{"role": "user", "content": "Tell me about the sea and the ships upon it. " * 12}]
    streams_cleanly(front, "roomy", long)
    assert served_by(front, "roomy") == "here"
    assert "context length" in target(front, "roomy", "cramped")["last_error"]


def test_a_stream_that_started_is_never_retried_and_a_refused_connection_falls_through(front, tmp_path):
    registry = write_registry(tmp_path, [{"name": "tiny", "model": "qwen"}])
    with daemon_process(registry, tmp_path) as doomed:
        front.files.backends["doomed"] = {"url": doomed.url + "/v1", "poll_interval_s": 300}
        front.files.failovers["fragile"] = {"targets": ["doomed:tiny", "here"], "strategy": "spillover"}
        front.files.write()
        reload(front.url)
        wait_until(lambda: target(front, "fragile", "doomed:tiny")["reachable"] is True)
        body = {"model": "fragile", "messages": MESSAGES, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        data = killed_mid_stream(front.url, body, doomed.process)
    assert "broke off the answer" in json.loads(data[-2][len("data: "):])["error"]["message"]
    assert data[-1] == "data: [DONE]"
    assert target(front, "fragile", "here")["requests"] == 0, "the started stream was not retried"
    assert served_by(front, "fragile") == "doomed:tiny"
    # The poll still says it is up (every 300 s): the refused connection lets `here` serve.
    assert target(front, "fragile", "doomed:tiny")["reachable"] is True
    assert ask(front, "fragile").choices[0].finish_reason == "length"
    assert served_by(front, "fragile") == "here"
    assert "Cannot reach backend `doomed`" in target(front, "fragile", "doomed:tiny")["last_error"]


def test_a_reload_edits_a_failover_entry_as_a_difference(front):
    ask(front, "spill")
    assert front.model("here")["state"] == "loaded"
    front.files.failovers["spill"] = {"targets": ["studio:tiny", "here"], "strategy": "spillover", "aliases": ["sp"]}
    front.files.write()
    report = reload(front.url)
    assert report["failover"] == ["spill"] and "failover: spill" in report["summary"]
    assert report["models"]["here"]["change"] == "unchanged"
    assert front.model("here")["state"] == "loaded", "no model drained for it"
    ask(front, "sp")
    assert served_by(front, "spill") == "studio:tiny"


def test_models_lists_failover_names_but_not_their_implicit_targets(front):
    listed = {m["id"]: m for m in httpx.get(f"{front.url}/v1/models", timeout=10).json()["data"]}
    assert listed["spill"]["targets"] == listed["sp"]["targets"]
    assert listed["warm-one"]["strategy"] == "warm" and listed["warm-one"]["owned_by"] == "mlxd"
    assert "studio:tiny" not in listed
    with pytest.raises(openai.NotFoundError):
        ask(front, "studio:tiny")
    implicit = front.model("studio:tiny")
    assert implicit["implicit"] is True and implicit["backend"] == "studio"


def test_every_surface_works_through_a_failover_entry(front):
    reply = anthropic.Anthropic(base_url=front.url, api_key="unused", max_retries=0).messages.create(
        model="warm-one", max_tokens=3, messages=MESSAGES, extra_body={"temperature": 0})
    assert reply.model == "warm-one" and reply.usage.output_tokens == 3
    response = client(front).responses.create(model="spill", input="Hello", max_output_tokens=3, temperature=0,
                                              store=False)
    assert response.usage.output_tokens == 3
    completion = client(front).completions.create(model="spill", prompt="Once upon", max_tokens=3, temperature=0)
    assert completion.usage.completion_tokens == 3


def test_mlxd_status_shows_each_failover_entry_and_its_targets(front):
    ask(front, "mended")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    result = subprocess.run(
        [sys.executable, "-m", "mlxd", "status", "--url", front.url], capture_output=True, text=True,
        env={**env, "COLUMNS": "160"}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    start = lines.index("failover")
    mended = next(i for i, line in enumerate(lines) if line.startswith("mended ") and i > start)
    assert "spillover" in lines[mended] and "last served by here" in lines[mended]
    # Its targets in the order a request would try them now: `here` first
    # while the backend reports its model failed.
    broken, here = sorted(lines[mended + 1:mended + 3], key=lambda line: not line.startswith("studio:broken"))
    # The backend's own state for it (loading, or failed while it backs off).
    assert broken.startswith("studio:broken (on studio, ") and "fell through" in broken
    assert here.startswith("here (here, ")


def test_the_dashboard_shows_each_failover_entry(front, browser):  # noqa: F811
    ask(front, "mended")
    browser.get(f"{front.url}/?interval=300")
    rows = _wait(browser, lambda d: d.execute_script("""
        const rows = Array.from(document.querySelectorAll('#failover tr[data-failover]'));
        return rows.length >= 3 && Object.fromEntries(rows.map(r => [r.dataset.failover, {
            strategy: r.querySelector('td.strategy').textContent,
            targets: Array.from(r.querySelectorAll('.target')).map(t => t.dataset.target),
            last: r.querySelector('td.last-served').textContent}]));"""))
    mended = rows["mended"]
    # Targets in the order a request would try them now, which depends on
    # whether the backend still reports its model failed.
    assert sorted(mended.pop("targets")) == ["here", "studio:broken"]
    assert mended == {"strategy": "spillover", "last": "here (200)"}
