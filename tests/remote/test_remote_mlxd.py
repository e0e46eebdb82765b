"""A front mlxd in front of a second, real `mlxd serve` (kind: mlxd) that
requires an api key: every request through the front is what the backend
itself answers, under the front's name, with the key taken from the
environment and never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitoring.test_dashboard import _wait, browser  # noqa: F401 (a fixture)
from support.daemon import daemon_in_thread, daemon_process, free_port, wait_until, write_registry
from support.remote import sse_events, write_front

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

KEY = "backend-secret-4d1f"
LIMIT = 64  # the backend's max_request_tokens; the front's is the default


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backend")
    # Greedy by default over there: what the front does not say, the backend decides.
    registry = write_registry(tmp, [{"name": "tiny", "model": "qwen", "defaults": {"temperature": 0}}], server={"max_request_tokens": LIMIT, "default_max_tokens": 16})
    with daemon_process(registry, tmp, "--api-key", KEY) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def front(backend, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("front")
    url = backend.url + "/v1"
    registry = write_front(
        tmp,
        {
            "studio": {"url": url, "kind": "mlxd", "api_key_env": "STUDIO_KEY", "poll_interval_s": 1},
            "stale": {"url": url, "kind": "mlxd", "api_key_env": "STALE_KEY"},
            "gone": {"url": f"http://127.0.0.1:{free_port()}/v1", "poll_interval_s": 1},
        },
        [
            {"name": "big", "backend": "studio", "remote_model": "tiny", "aliases": ["b"]},
            {"name": "ghost", "backend": "studio", "remote_model": "not-there"},
            {"name": "stale-key", "backend": "stale", "remote_model": "tiny"},
            {"name": "local", "model": "llama"},
        ],
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STUDIO_KEY", KEY)
        env.setenv("STALE_KEY", "not-the-key")
        with daemon_in_thread(registry, tmp) as daemon:
            yield daemon


def direct(backend) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.url + "/v1", api_key=KEY, max_retries=0)


def via(front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def test_a_chat_through_the_front_is_the_backends_own_answer(front, backend):
    ours = via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=12, temperature=0)
    theirs = direct(backend).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert ours.model == "big"
    assert ours.choices[0].message.content == theirs.choices[0].message.content
    assert ours.choices[0].finish_reason == theirs.choices[0].finish_reason == "length"
    assert (ours.usage.prompt_tokens, ours.usage.completion_tokens) == (theirs.usage.prompt_tokens, 12)


def test_sampling_nobody_asked_for_is_the_backends_own_default(front, backend):
    ours = [via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=12) for _ in range(2)]
    greedy = direct(backend).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    assert [a.choices[0].message.content for a in ours] == [greedy.choices[0].message.content] * 2


def test_a_stream_is_relayed_chunk_by_chunk_under_the_front_name_with_usage(front):
    client = via(front)
    whole = client.chat.completions.create(model="b", messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="b", messages=MESSAGES, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert {c.model for c in chunks} == {"b"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-1].usage.completion_tokens == 10


def test_completions_work_on_a_remote_entry(front, backend):
    ours = via(front).completions.create(model="big", prompt="Once upon", max_tokens=6, temperature=0)
    theirs = direct(backend).completions.create(model="tiny", prompt="Once upon", max_tokens=6, temperature=0)
    assert ours.choices[0].text == theirs.choices[0].text
    assert ours.usage.completion_tokens == 6


def test_logit_bias_and_a_completions_response_format_are_relayed_to_the_backend(front, backend):
    # Token 294 is " the" in the tiny qwen2's vocabulary.
    biased = via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=6, logit_bias={"294": 100})
    assert biased.choices[0].message.content.split() == ["the"] * 6
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    shaped = {"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": schema}}}
    ours = via(front).completions.create(model="big", prompt="Once upon", max_tokens=12, extra_body=shaped)
    theirs = direct(backend).completions.create(model="tiny", prompt="Once upon", max_tokens=12, extra_body=shaped)
    assert ours.choices[0].text == theirs.choices[0].text
    assert isinstance(json.loads(ours.choices[0].text)["ok"], bool)
    # The ids are the backend model's: its vocabulary decides, and its 400 comes back.
    with pytest.raises(openai.BadRequestError) as outside:
        via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=2, logit_bias={"2048": 1})
    assert "outside this model's vocabulary" in outside.value.message


def test_models_lists_remote_names_owned_by_their_backend(front):
    owners = {m.id: m.owned_by for m in via(front).models.list()}
    assert owners["big"] == owners["b"] == "studio"
    assert owners["local"] == "mlxd"


def test_status_shows_the_backend_and_its_models_but_never_the_key(front):
    via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=2)
    # The backend's model states come from the front's background poll, which
    # may still hold a snapshot taken while the backend was loading.
    studio = wait_until(
        lambda: next((b for b in front.status()["backends"]
                      if b["name"] == "studio" and b["models"].get("tiny") == "loaded"), None)
    )
    assert studio["reachable"] is True and studio["latency_ms"] >= 0
    assert studio["models"] == {"tiny": "loaded"}
    assert studio["in_flight"] == 0 and studio["requests"] >= 1
    assert studio["api_key_env"] == "STUDIO_KEY"
    everything = httpx.get(f"{front.url}/v1/status", timeout=10).text + httpx.get(f"{front.url}/metrics").text
    assert KEY not in everything
    big = front.model("big")
    assert big["backend"] == "studio" and big["remote_model"] == "tiny"
    assert big["memory"]["reserved_bytes"] == 0


def test_remote_requests_cost_no_local_memory(front):
    via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=2)
    status = front.status()
    assert front.model("local")["state"] == "unloaded"
    assert status["memory"]["committed_bytes"] == 0


def test_an_upstream_4xx_is_passed_through_with_its_message(front):
    with pytest.raises(openai.BadRequestError) as too_long:
        via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=LIMIT + 1)
    assert f"max_tokens exceeds server limit ({LIMIT})" in too_long.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        via(front).chat.completions.create(model="ghost", messages=MESSAGES, max_tokens=4)
    assert "`not-there` does not exist" in unknown.value.message


def test_a_stream_refused_upstream_is_a_status_code_not_a_broken_stream(front):
    response = httpx.post(
        f"{front.url}/v1/chat/completions",
        json={"model": "ghost", "messages": MESSAGES, "max_tokens": 4, "stream": True},
        timeout=30,
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_a_backend_refusing_mlxds_key_is_a_bad_gateway_naming_the_setting(front):
    with pytest.raises(openai.APIStatusError) as refused:
        via(front).chat.completions.create(model="stale-key", messages=MESSAGES, max_tokens=4)
    assert refused.value.status_code == 502
    assert "api_key_env" in refused.value.message


def test_metrics_label_requests_by_backend(front):
    via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=2)
    text = httpx.get(f"{front.url}/metrics", timeout=10).text
    assert 'mlxd_backend_requests_total{backend="studio",model="big",status="200"}' in text
    assert 'mlxd_backend_up{backend="studio"} 1.0' in text
    # A count since start is a counter, so rate() and increase() can read it.
    errors = next(f for f in text_string_to_metric_families(text) if f.name == "mlxd_backend_errors")
    assert errors.type == "counter" and {s.name for s in errors.samples} == {"mlxd_backend_errors_total"}


def test_a_local_model_beside_remote_ones_still_serves(front):
    answer = via(front).chat.completions.create(model="local", messages=MESSAGES, max_tokens=3)
    assert answer.usage.completion_tokens == 3
    stream = httpx.post(
        f"{front.url}/v1/chat/completions",
        json={"model": "local", "messages": MESSAGES, "max_tokens": 3, "stream": True},
        timeout=30,
    )
    assert sse_events(stream)[-1] == "[DONE]"


def _all_polled(front) -> bool:
    return all(b["polled_at"] for b in front.status()["backends"])


def test_mlxd_status_shows_each_backend(front):
    via(front).chat.completions.create(model="big", messages=MESSAGES, max_tokens=2)
    wait_until(lambda: _all_polled(front))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    result = subprocess.run(
        [sys.executable, "-m", "mlxd", "status", "--url", front.url], capture_output=True, text=True,
        env={**env, "COLUMNS": "160"}, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "backends" in lines
    assert lines["studio"].split()[1] == "up" and "0/8 in flight" in lines["studio"]
    assert "unreachable" in lines["gone"]
    assert "tiny loaded" in result.stdout
    assert "on studio" in lines["big"]


def test_the_dashboard_shows_backends_and_where_remote_models_live(front, browser):  # noqa: F811
    wait_until(lambda: _all_polled(front))
    browser.get(f"{front.url}/?interval=300")
    rows = _wait(browser, lambda d: d.execute_script("""
        const rows = Array.from(document.querySelectorAll('#backends tr[data-backend]'));
        return rows.length === 3 && Object.fromEntries(rows.map(r => [r.dataset.backend, {
            reachable: r.querySelector('td.reachable .badge').textContent,
            models: r.querySelector('td.models-there').textContent}]));"""))
    assert rows["studio"] == {"reachable": "yes", "models": "tiny loaded"}
    assert rows["gone"]["reachable"] == "no"
    memory = browser.execute_script(
        "return document.querySelector('#models tr[data-model=\"big\"] td.memory').textContent;")
    assert memory == "on studio"
