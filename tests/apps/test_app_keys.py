"""Several apps, one daemon (docs/apps.md): each app's key reaches the
models and routes its entry names and nothing else, each surface refuses in
its own error shape, a reload that removes an app ends its access at once,
and no key, nor its hash, shows in logs, status or errors. One echo daemon
for the module (the echo kind stands in for a model: this is the API layer)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from mlxd.cli.status import render
from support.daemon import wait_until
from support.echo_engine import echo_daemon

EDITOR, INDEXER, OPS, BATCH = "sk-editor-5f1c", "sk-indexer-77ab", "sk-ops-0d9e", "sk-batch-91aa"
CHATTER = "sk-chatter-3c2e"
KEYS = (EDITOR, INDEXER, OPS, BATCH, CHATTER)
SECRETS = (*KEYS, *(hashlib.sha256(k.encode()).hexdigest() for k in KEYS))
CHAT = {"messages": [{"role": "user", "content": "hello there"}]}


def apps(tmp: Any) -> list[dict[str, Any]]:
    (tmp / "ops.key").write_text(OPS + "\n")
    return [
        {"name": "editor", "key_env": "MLXD_TEST_EDITOR_KEY", "models": ["echo-a"], "priority": "interactive"},
        {"name": "indexer", "key_sha256": hashlib.sha256(INDEXER.encode()).hexdigest(), "routes": ["embeddings"],
         "priority": "bulk"},
        {"name": "ops", "key_file": str(tmp / "ops.key"), "admin": True},
        {"name": "batch", "key_sha256": hashlib.sha256(BATCH.encode()).hexdigest(), "rpm": 3, "max_concurrency": 1},
        {"name": "chatter", "key_sha256": hashlib.sha256(CHATTER.encode()).hexdigest(), "routes": ["generation"]},
    ]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("apps")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLXD_TEST_EDITOR_KEY", EDITOR)
        with echo_daemon(tmp, apps=apps(tmp)) as d:
            d.tmp = tmp
            # The limits' clock, turned by the tests.
            d.now = [1_700_000_000.0]
            d.ctx.limits.clock = lambda: d.now[0]
            yield d


def call(daemon: Any, method: str, path: str, key: str | None, body: Any = None, header: str = "bearer") -> httpx.Response:
    headers = {}
    if key is not None:
        headers = {"authorization": f"Bearer {key}"} if header == "bearer" else {"x-api-key": key}
    return httpx.request(method, daemon.url + path, json=body, headers=headers, timeout=30)


# Each surface's generation route, a body for it, and where its error's message is.
SURFACES = [
    ("/v1/chat/completions", lambda m: {"model": m, **CHAT}, lambda b: b["error"]["message"]),
    ("/v1/messages", lambda m: {"model": m, "max_tokens": 8, **CHAT}, lambda b: b["error"]["message"]),
    ("/v1/responses", lambda m: {"model": m, "input": "hello there"}, lambda b: b["error"]["message"]),
    ("/v1/completions", lambda m: {"model": m, "prompt": "hello"}, lambda b: b["error"]["message"]),
]


def test_a_scoped_key_uses_its_model_and_gets_403_on_another_in_each_surfaces_shape(daemon):
    ok = call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", **CHAT})
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"] == "hello there"
    for path, body, message in SURFACES:
        refused = call(daemon, "POST", path, EDITOR, body("echo-b"), header="x-api-key")
        assert refused.status_code == 403, (path, refused.text)
        assert "may not use model `echo-b`" in message(refused.json()), path
    anthropic = call(daemon, "POST", "/v1/messages", EDITOR, SURFACES[1][1]("echo-b")).json()
    assert anthropic["type"] == "error" and anthropic["error"]["type"] == "permission_error"
    openai = call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-b", **CHAT}).json()
    assert openai["error"]["code"] == "forbidden" and openai["error"]["param"] == "model"
    # Ollama's shape is a bare message; the editor has no embeddings model to ask for.
    ollama = call(daemon, "POST", "/api/embed", EDITOR, {"model": "echo-b", "input": "x"})
    assert ollama.status_code == 403 and "echo-b" in ollama.json()["error"]
    # The model list shows it only what it may use.
    listed = call(daemon, "GET", "/v1/models", EDITOR).json()
    assert [m["id"] for m in listed["data"]] == ["echo-a"]


def test_a_name_made_up_to_match_an_apps_globs_does_not_reach_a_model_outside_them(daemon):
    """A catch-all alias (`*`) answers any name: an app scoped to `echo-a*`
    asked for `echo-a-mini`, which its globs match, and was served by
    echo-b, a model its status and model list did not even show it."""
    path = daemon.tmp / "models.yaml"
    good = path.read_text()
    doc = yaml.safe_load(good)
    doc["models"][1]["aliases"] = ["*"]
    next(a for a in doc["apps"] if a["name"] == "editor")["models"] = ["echo-a*", "echo-chosen"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code == 200
        for path_, body, message in SURFACES:
            refused = call(daemon, "POST", path_, EDITOR, body("echo-a-mini"))
            assert refused.status_code == 403, (path_, refused.text)
            assert "may not use model `echo-a-mini` (it is served by a model outside its models: echo-a*, " \
                "echo-chosen)" in message(refused.json()), path_
        # A name the scope lists itself (no glob) is the operator's choice: whatever answers it serves the app.
        assert call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-chosen", **CHAT}).status_code == 200
        assert call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", **CHAT}).status_code == 200
        assert [m["id"] for m in call(daemon, "GET", "/v1/models", EDITOR).json()["data"]] == ["echo-a"]
        # An app whose globs cover the entry still reaches it by any name its alias answers.
        assert call(daemon, "POST", "/v1/chat/completions", OPS, {"model": "echo-a-mini", **CHAT}).status_code == 200
    finally:
        path.write_text(good)
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code == 200
        # The module's other tests start with echo-b unloaded (one model fits).
        assert call(daemon, "POST", "/v1/models/echo-b/unload", OPS, {}).status_code == 200


def test_a_failover_entry_an_app_may_use_by_its_alias_shows_in_its_status_and_metrics(daemon):
    """Scope is the entry's names, aliases included: the app was served by
    the entry, but its status left the entry out and its /metrics dropped
    the entry's series (only models' aliases were looked up)."""
    path = daemon.tmp / "models.yaml"
    good = path.read_text()
    doc = yaml.safe_load(good)
    doc["models"].append({"name": "pair", "aliases": ["team-*"], "targets": ["echo-a", "echo-b"]})
    next(a for a in doc["apps"] if a["name"] == "editor")["models"] = ["echo-a", "team-*"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code == 200
        assert call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "team-x", **CHAT}).status_code == 200
        assert [f["name"] for f in call(daemon, "GET", "/v1/status", EDITOR).json()["failover"]] == ["pair"]
        metrics = call(daemon, "GET", "/metrics", EDITOR).text
        assert 'mlxd_requests_total{model="pair",status="200"}' in metrics
    finally:
        path.write_text(good)
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code == 200


def test_the_sdks_retrieve_a_model_the_app_may_use_and_no_other(daemon):
    """`client.models.retrieve(...)` (GET /v1/models/{id}) was a 404 "No route"
    on both SDKs, for every key and every model."""
    got = openai.OpenAI(base_url=daemon.url + "/v1", api_key=EDITOR).models.retrieve("echo-a")
    assert got.id == "echo-a" and got.owned_by == "mlxd"
    claude = anthropic.Anthropic(base_url=daemon.url, api_key=EDITOR)
    assert claude.models.retrieve("echo-a").display_name == "echo-a"
    with pytest.raises(anthropic.PermissionDeniedError, match="may not use model `echo-b`"):
        claude.models.retrieve("echo-b")
    with pytest.raises(openai.NotFoundError, match="does not exist. Available models: `echo-a`$"):
        openai.OpenAI(base_url=daemon.url + "/v1", api_key=EDITOR).models.retrieve("echo-z")
    assert call(daemon, "GET", "/v1/models/echo-b", None).status_code == 401
    assert call(daemon, "GET", "/v1/models/echo-b", OPS).json()["id"] == "echo-b"


ADMIN_ROUTES = [
    ("POST", "/v1/models/echo-a/load"), ("POST", "/v1/models/echo-a/unload"), ("POST", "/v1/models/echo-a/pin"),
    ("POST", "/v1/models/echo-a/unpin"), ("POST", "/v1/admin/reload"), ("DELETE", "/v1/cache"),
    ("DELETE", "/v1/cache/prefix"), ("GET", "/v1/captures"),
]


def test_a_key_without_admin_gets_403_on_every_admin_route(daemon):
    for method, path in ADMIN_ROUTES:
        refused = call(daemon, method, path, EDITOR)
        assert refused.status_code == 403, (method, path, refused.text)
        assert "needs an admin key; app `editor`" in refused.json()["error"]["message"]
    capture = call(daemon, "PUT", "/v1/capture", EDITOR, {"enabled": True})
    assert capture.status_code == 403, capture.text
    assert call(daemon, "POST", "/v1/models/echo-b/pin", OPS, {}).status_code == 200


def test_routes_scope_an_app_to_its_route_groups(daemon):
    # The indexer may embed (the echo models are no embedding models: a 400, past the gate)...
    embed = call(daemon, "POST", "/v1/embeddings", INDEXER, {"model": "echo-a", "input": "x"})
    assert embed.status_code == 400, embed.text
    # ... and generates nothing, on any surface.
    for path, body, message in SURFACES:
        refused = call(daemon, "POST", path, INDEXER, body("echo-a"))
        assert refused.status_code == 403, (path, refused.text)
        assert "may not call generation routes (its routes: embeddings)" in message(refused.json())


# Every embedding and rerank route, with a body it takes.
EMBEDDING_ROUTES = [
    ("/v1/embeddings", {"model": "echo-a", "input": "x"}),
    ("/v1/rerank", {"model": "echo-a", "query": "q", "documents": ["d"]}),
    ("/rerank", {"model": "echo-a", "query": "q", "documents": ["d"]}),
    ("/v2/rerank", {"model": "echo-a", "query": "q", "documents": ["d"]}),
    ("/api/embed", {"model": "echo-a", "input": "x"}),
    ("/api/embeddings", {"model": "echo-a", "prompt": "x"}),
]


def test_an_app_without_the_embeddings_group_is_refused_on_every_embedding_route(daemon):
    """Ollama's older /api/embeddings was missing from the group, so an app
    kept to generation could embed there, past its rpm and concurrency too."""
    assert call(daemon, "POST", "/v1/chat/completions", CHATTER, {"model": "echo-a", **CHAT}).status_code == 200
    for path, body in EMBEDDING_ROUTES:
        refused = call(daemon, "POST", path, CHATTER, body)
        assert refused.status_code == 403, (path, refused.text)
        assert "may not call embeddings routes (its routes: generation)" in refused.text, path


def test_a_missing_or_unknown_key_is_a_401_in_each_surfaces_shape(daemon):
    for path, body, message in SURFACES:
        for key in (None, "sk-nobody"):
            refused = call(daemon, "POST", path, key, body("echo-a"))
            assert refused.status_code == 401, (path, key, refused.text)
    assert call(daemon, "POST", "/v1/messages", "sk-nobody", SURFACES[1][1]("echo-a")).json()["error"]["type"] == \
        "authentication_error"
    assert call(daemon, "POST", "/api/embed", None, {"model": "echo-a", "input": "x"}).json()["error"].startswith(
        "API key required")
    assert call(daemon, "GET", "/v1/status", None).status_code == 401


def test_a_limit_hit_is_a_429_with_retry_after_and_ratelimit_headers_and_resets(daemon):
    ask = {"model": "echo-a", **CHAT}
    first = call(daemon, "POST", "/v1/chat/completions", BATCH, ask)
    assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "2"
    daemon.now[0] += 15
    assert call(daemon, "POST", "/v1/chat/completions", BATCH, ask).status_code == 200
    assert call(daemon, "POST", "/v1/messages", BATCH, {**ask, "max_tokens": 8}).status_code == 200
    daemon.now[0] += 15
    for path, body, message in SURFACES:
        refused = call(daemon, "POST", path, BATCH, body("echo-a"))
        assert refused.status_code == 429, (path, refused.text)
        # The first request leaves the minute 30 s from now.
        assert refused.headers["retry-after"] == "30" and refused.headers["x-ratelimit-reset-requests"] == "30s"
        assert refused.headers["x-ratelimit-limit-requests"] == "3"
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert "over its limit of 3 requests per minute (`rpm`)" in message(refused.json())
    assert call(daemon, "POST", "/v1/messages", BATCH, SURFACES[1][1]("echo-a")).json()["error"]["type"] == \
        "rate_limit_error"
    assert call(daemon, "POST", "/v1/chat/completions", BATCH, ask).json()["error"]["code"] == "rate_limit_exceeded"
    daemon.now[0] += 30
    assert call(daemon, "POST", "/v1/chat/completions", BATCH, ask).status_code == 200
    # Other apps are not held to the batch app's limit.
    assert call(daemon, "POST", "/v1/chat/completions", EDITOR, ask).status_code == 200


@contextlib.contextmanager
def batch_holding_a_request(daemon: Any) -> Iterator[None]:
    """A request of the batch app under way (the echo engine holds it) until the block ends."""
    engine = daemon.ctx.manager._models["echo-a"].engine
    engine.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(call, daemon, "POST", "/v1/chat/completions", BATCH,
                           {"model": "echo-a", "messages": [{"role": "user", "content": "hold on"}]})
        wait_until(lambda: daemon.ctx.limits.book.active("batch") == 1)
        try:
            yield
        finally:
            engine.gate.set()
        assert held.result().status_code == 200


def test_max_concurrency_refuses_a_second_request_while_the_first_streams(daemon):
    daemon.now[0] += 3600
    with batch_holding_a_request(daemon):
        refused = call(daemon, "POST", "/v1/chat/completions", BATCH, {"model": "echo-a", **CHAT})
        assert refused.status_code == 429 and refused.headers["x-ratelimit-remaining-concurrency"] == "0"
        assert "limit of 1 requests at once (`max_concurrency`)" in refused.json()["error"]["message"]
    assert daemon.ctx.limits.book.active("batch") == 0
    assert call(daemon, "POST", "/v1/chat/completions", BATCH, {"model": "echo-a", **CHAT}).status_code == 200


def test_an_app_reusing_another_apps_request_id_does_not_take_its_cancel_away(daemon):
    """Ids are the clients' own (X-Request-Id): the newest request under way
    answered to one, so an app sending another's id hid that request from
    its owner, whose cancel was then a 404."""
    assert call(daemon, "POST", "/v1/chat/completions", OPS, {"model": "echo-a", **CHAT}).status_code == 200
    engine = daemon.ctx.manager._models["echo-a"].engine
    engine.gate.clear()
    hold = {"model": "echo-a", "messages": [{"role": "user", "content": "hold on"}]}

    def held(key: str) -> httpx.Response:
        return httpx.post(daemon.url + "/v1/chat/completions", json=hold, timeout=30,
                          headers={"authorization": f"Bearer {key}", "x-request-id": "job-1"})

    with ThreadPoolExecutor(2) as pool:
        mine = pool.submit(held, CHATTER)
        wait_until(lambda: len(daemon.ctx.inflight) == 1)
        # The editor's, with the same id, queues behind it.
        theirs = pool.submit(held, EDITOR)
        wait_until(lambda: len(daemon.ctx.inflight) == 2)
        cancelled = call(daemon, "POST", "/v1/requests/job-1/cancel", CHATTER)
        assert cancelled.status_code == 200, cancelled.text
        try:
            # Cancelled before any output: a whole answer of what it had, nothing.
            assert mine.result(timeout=10).json()["choices"][0]["message"]["content"] == ""
            assert [(r["key"], r["cancelled"]) for r in call(daemon, "GET", "/v1/requests", OPS).json()["data"]] == \
                [("editor", False)]
        finally:
            engine.gate.set()
        assert theirs.result().json()["choices"][0]["message"]["content"] == "hold on"


def test_n_choices_charge_their_app_the_prompt_once_as_the_answer_reports_it(daemon):
    """The answer's usage counted the prompt once (as OpenAI does) but the
    app's usage, tpm and day were charged it n times."""
    def editor_echo_a() -> tuple[int, int]:
        usage = call(daemon, "GET", "/v1/status", OPS).json()["usage"]
        row = next((u for u in usage if (u["app"], u["model"]) == ("editor", "echo-a")), None)
        return (row["tokens_in"], row["tokens_out"]) if row else (0, 0)

    before = editor_echo_a()
    answer = call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", "n": 3, **CHAT})
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (2, 6)
    after = editor_echo_a()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 6)


def test_an_apps_429s_and_a_refused_key_show_in_metrics_and_the_log(daemon, caplog):
    """An operator asks "which app is being refused, and why?": /metrics
    answers per app and status, the log has one line per refusal."""
    caplog.set_level(logging.INFO, logger="mlxd.requests")

    def refusals() -> dict[tuple[str, str], float]:
        samples = scrape(daemon, {"authorization": f"Bearer {OPS}"})
        return {(labels["app"], labels["status"]): v for name, labels, v in samples
                if name == "mlxd_app_refusals_total"}

    def requests(status: str) -> float:
        samples = scrape(daemon, {"authorization": f"Bearer {OPS}"})
        return sum(v for name, labels, v in samples if name == "mlxd_requests_total" and labels["status"] == status)

    before, before_429 = refusals(), requests("429")
    daemon.now[0] += 3600
    ask = {"model": "echo-a", **CHAT}
    statuses = [call(daemon, "POST", "/v1/chat/completions", BATCH, ask).status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]
    assert call(daemon, "POST", "/v1/chat/completions", "sk-nobody", ask).status_code == 401
    after = refusals()
    assert after[("batch", "429")] - before.get(("batch", "429"), 0) == 2
    assert after[("-", "401")] - before.get(("-", "401"), 0) == 1
    assert requests("429") - before_429 == 2
    lines = [r.getMessage() for r in caplog.records if " refused " in r.getMessage()]
    assert len([line for line in lines if "caller=batch status=429" in line]) == 2, lines
    assert [line for line in lines if "caller=- status=401" in line], lines
    assert not [line for line in lines for secret in SECRETS if secret in line]


def test_status_metrics_and_mlxd_status_show_each_apps_requests_under_way_and_the_room_left(daemon):
    """"Which app is using what, and how close is it to a 429?", answered
    before the 429: the batch app (rpm 3, one at a time) holds a request."""
    daemon.now[0] += 3600
    ask = {"model": "echo-a", **CHAT}
    assert call(daemon, "POST", "/v1/chat/completions", BATCH, ask).status_code == 200
    with batch_holding_a_request(daemon):
        doc = call(daemon, "GET", "/v1/status", OPS).json()
        batch = next(a for a in doc["apps"] if a["name"] == "batch")
        assert batch["in_flight"] == 1
        limits = {room["name"]: room for room in batch["limits"]}
        assert limits["rpm"] == {"name": "rpm", "limit": 3, "remaining": 1, "reset_seconds": 0.0}
        assert limits["max_concurrency"]["remaining"] == 0
        assert next(a for a in doc["apps"] if a["name"] == "editor") == {
            "name": "editor", "priority": "interactive", "admin": False, "in_flight": 0, "limits": []}
        room = {(labels["app"], labels["limit"]): v for name, labels, v in scrape(daemon, {"authorization": f"Bearer {OPS}"})
                if name == "mlxd_app_limit_remaining"}
        assert room[("batch", "rpm")] == 1 and room[("batch", "max_concurrency")] == 0
        # The app's own key reads its own line, no other app's.
        assert [a["name"] for a in call(daemon, "GET", "/v1/status", BATCH).json()["apps"]] == ["batch"]
    console = Console(width=100, record=True)
    console.print(render(doc, 100))
    line = next(row for row in console.export_text().splitlines() if row.startswith("batch "))
    assert line.split() == ["batch", "default", "1", "1/3", "—", "—", "0/1"], line


def scrape(daemon: Any, headers: dict[str, str]) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(daemon.url + "/metrics", headers=headers, timeout=10).text
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def everything_generation(daemon: Any) -> int:
    return call(daemon, "GET", "/v1/status", OPS).json()["config"]["generation"]


def test_status_for_an_apps_key_shows_its_own_models_and_no_configuration(daemon):
    mine = call(daemon, "GET", "/v1/status", EDITOR).json()
    assert [m["name"] for m in mine["models"]] == ["echo-a"]
    assert mine["app"]["name"] == "editor" and mine["app"]["priority"] == "interactive"
    assert mine["config"] == {"generation": everything_generation(daemon)} and mine["backends"] == []
    assert mine["memory"]["budget_bytes"] > 0
    everything = call(daemon, "GET", "/v1/status", OPS).json()
    assert [m["name"] for m in everything["models"]] == ["echo-a", "echo-b"]
    assert everything["config"]["path"].endswith("models.yaml")


def test_an_apps_key_reads_only_its_own_models_prefix_caches(daemon):
    mine = call(daemon, "GET", "/v1/cache/stats", EDITOR)
    assert [m["model"] for m in mine.json()["models"]] == ["echo-a"], mine.text
    assert call(daemon, "GET", "/v1/cache/stats?model=echo-b", EDITOR).status_code == 403
    assert call(daemon, "GET", "/v1/cache/stats?model=echo-a", EDITOR).status_code == 200
    every = call(daemon, "GET", "/v1/cache/stats", OPS).json()
    assert [m["model"] for m in every["models"]] == ["echo-a", "echo-b"]


def test_only_the_app_that_stored_a_response_continues_it(daemon):
    first = call(daemon, "POST", "/v1/responses", CHATTER, {"model": "echo-a", "input": "my secret is 4417"})
    assert first.status_code == 200, first.text
    follow = {"model": "echo-a", "input": "and then?", "previous_response_id": first.json()["id"]}
    assert call(daemon, "POST", "/v1/responses", CHATTER, follow).status_code == 200
    other = call(daemon, "POST", "/v1/responses", EDITOR, follow)
    assert other.status_code == 400, other.text
    assert other.json()["error"]["code"] == "previous_response_not_found"
    assert "4417" not in other.text


def test_an_apps_key_reads_that_the_configuration_is_invalid_but_not_its_file_or_lines(daemon):
    path = daemon.tmp / "models.yaml"
    good = path.read_text()
    doc = yaml.safe_load(good)
    doc["apps"].append({"name": "pasted", "key_env": "sk-pasted-by-mistake-1234"})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code >= 400
        mine = call(daemon, "GET", "/v1/status", EDITOR).json()["health"]
        assert mine == {"status": "degraded", "problems": ["the configuration file on disk is invalid"]}
        full = call(daemon, "GET", "/v1/status", OPS).json()["health"]["problems"]
        assert any("models.yaml" in p and "apps[5].key_env" in p for p in full), full
        assert not [p for p in full if "sk-pasted" in p], "a key pasted as a variable's name is not repeated"
    finally:
        path.write_text(good)
        assert call(daemon, "POST", "/v1/admin/reload", OPS, {}).status_code == 200
    assert call(daemon, "GET", "/v1/status", EDITOR).json()["health"] == {"status": "ok", "problems": []}


def test_requests_refused_before_planning_count_in_their_apps_usage_and_are_kept_like_the_others(daemon):
    def editor() -> dict[str, tuple[int, int]]:
        usage = call(daemon, "GET", "/v1/status", OPS).json()["usage"]
        return {u["model"]: (u["requests"], u["errors"]) for u in usage if u["app"] == "editor"}

    before = editor()
    assert call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-b", **CHAT}).status_code == 403
    bad = call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", "messages": "hi"})
    assert bad.status_code in (400, 422), bad.text
    # An embeddings request for a model that embeds nothing: refused before it is leased.
    assert call(daemon, "POST", "/v1/embeddings", EDITOR, {"model": "echo-a", "input": "x"}).status_code == 400
    assert call(daemon, "POST", "/v1/chat/completions", "sk-nobody", {"model": "echo-a", **CHAT}).status_code == 401
    after = editor()
    was_a, was_b = before.get("echo-a", (0, 0)), before.get("echo-b", (0, 0))
    assert after["echo-b"] == (was_b[0] + 1, was_b[1] + 1)
    assert after["echo-a"] == (was_a[0] + 2, was_a[1] + 2)
    # What the activity log's sqlite keeps (a restart restores it) is what status counts.
    assert daemon.ctx.activity.flush()
    kept = {(app, model): tuple(values) for app, model, *values in daemon.ctx.activity.usage_totals()}
    live = {(u["app"], u["model"]): (u["requests"], u["errors"], u["tokens_in"], u["tokens_cached"], u["tokens_out"])
            for u in call(daemon, "GET", "/v1/status", OPS).json()["usage"]}
    assert kept == live
    assert not [app for app, _ in kept if app == "-"], "a refused key is nobody's usage"


def test_a_reload_that_removes_an_app_ends_its_access_at_once_and_keys_never_show(daemon, caplog):
    caplog.set_level(logging.DEBUG)
    assert call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", **CHAT}).status_code == 200
    path = daemon.tmp / "models.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["apps"] = [a for a in doc["apps"] if a["name"] != "editor"] + [{"name": "local", "key": "none",
                                                                       "models": ["echo-b"]}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    report = call(daemon, "POST", "/v1/admin/reload", OPS, {})
    assert report.status_code == 200, report.text
    assert "apps: editor, local" in report.json()["summary"]
    refused = call(daemon, "POST", "/v1/chat/completions", EDITOR, {"model": "echo-a", **CHAT})
    assert refused.status_code == 401 and refused.json()["error"]["message"] == "Invalid API key"
    # A keyless loopback request is now the `local` app, under its own scope.
    assert call(daemon, "POST", "/v1/chat/completions", None, {"model": "echo-b", **CHAT}).status_code == 200
    assert call(daemon, "POST", "/v1/chat/completions", None, {"model": "echo-a", **CHAT}).status_code == 403
    seen = [r.getMessage() for r in caplog.records]
    seen += [call(daemon, "GET", "/v1/status", OPS).text, report.text, refused.text]
    seen += [call(daemon, "GET", "/v1/activity", OPS).text]
    assert not [s for s in seen for secret in SECRETS if secret in s]
