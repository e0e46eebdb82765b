"""Priority classes end to end, on a real tiny model behind a real daemon:
an interactive app's request that arrives behind queued bulk work is served
before it. One daemon for the module."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from support.daemon import daemon_in_thread, holding_the_worker, wait_until, write_registry

EDITOR, BULK, OPS, STRANGER = "sk-editor-e2e", "sk-bulk-e2e", "sk-ops-e2e", "sk-stranger-e2e"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("priority")
    path = write_registry(tmp, [
        {"name": "tiny", "model": "qwen", "max_concurrency": 1, "preload": True},
        {"name": "wide", "model": "qwen", "max_concurrency": 2, "preload": True},
        {"name": "pair", "targets": ["wide", "tiny"]},  # warm: both loaded, so `wide` first
    ])
    text = path.read_text() + (
        "apps:\n"
        f"  - {{name: editor, key_sha256: {_sha(EDITOR)}, priority: interactive}}\n"
        f"  - {{name: indexer, key_sha256: {_sha(BULK)}, priority: bulk}}\n"
        f"  - {{name: ops, key_sha256: {_sha(OPS)}, admin: true}}\n"
        f"  - {{name: stranger, key_sha256: {_sha(STRANGER)}, models: [other]}}\n"
    )
    path.write_text(text)
    with daemon_in_thread(path, tmp, history_step_seconds=0.2) as d:
        wait_until(lambda: all(d.ctx.manager.view(m).state.value == "loaded" for m in ("tiny", "wide")), timeout=120)
        yield d


def complete(daemon: Any, key: str, max_tokens: int, done: list[str], label: str) -> int:
    body = {"model": "tiny", "prompt": "one two three", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0}
    answer = httpx.post(daemon.url + "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"},
                        timeout=120)
    done.append(label)
    return answer.status_code


def test_an_interactive_request_is_served_before_bulk_work_queued_ahead_of_it(daemon):
    core = daemon.ctx.manager.core
    done: list[str] = []
    with ThreadPoolExecutor(5) as pool:
        # A long bulk generation holds the only slot; three more queue behind it.
        running = pool.submit(complete, daemon, BULK, 400, done, "bulk-0")
        wait_until(lambda: core.residents["tiny"].active == 1)
        queued = [pool.submit(complete, daemon, BULK, 4, done, f"bulk-{i}") for i in (1, 2, 3)]
        wait_until(lambda: core.queued("tiny") == 3)
        editor = pool.submit(complete, daemon, EDITOR, 4, done, "editor")
        wait_until(lambda: core.queued("tiny") == 4)
        assert core.residents["tiny"].active == 1, "the long bulk request still runs: the race is set up"
        statuses = [f.result() for f in (running, *queued, editor)]
    assert statuses == [200] * 5
    assert done[:2] == ["bulk-0", "editor"], done
    assert sorted(done[2:]) == ["bulk-1", "bulk-2", "bulk-3"]


def test_usage_per_app_and_model_is_in_status_and_metrics_with_the_app_label(daemon):
    ops = {"authorization": f"Bearer {EDITOR}"}
    before = httpx.get(daemon.url + "/v1/status", headers=ops, timeout=30).json()
    complete(daemon, EDITOR, 3, [], "editor")
    complete(daemon, EDITOR, 2, [], "editor")
    mine = httpx.get(daemon.url + "/v1/status", headers=ops, timeout=30).json()
    # The editor's key is no admin key: it reads its own usage only.
    assert {u["app"] for u in mine["usage"]} == {"editor"}
    row, old = mine["usage"][0], before["usage"][0]
    assert (row["model"], row["requests"] - old["requests"], row["errors"]) == ("tiny", 2, 0)
    assert row["tokens_out"] - old["tokens_out"] == 5 and row["tokens_in"] > old["tokens_in"]
    metrics = _get(daemon, "/metrics", OPS).text
    # The direction label is named as mlxd_tokens_total's is.
    assert f'mlxd_app_tokens_total{{app="editor",direction="out",model="tiny"}} {float(row["tokens_out"])}' in metrics
    assert 'mlxd_app_requests_total{app="indexer",model="tiny"} 4.0' in metrics


def _get(daemon: Any, path: str, key: str) -> httpx.Response:
    answer = httpx.get(daemon.url + path, headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer


def test_a_key_that_is_not_admin_reads_only_its_own_app_and_models_in_metrics_and_history(daemon):
    complete(daemon, EDITOR, 2, [], "editor")
    wait_until(lambda: "tiny" in _get(daemon, "/v1/history", OPS).json()["models"])
    indexer = _get(daemon, "/metrics", BULK).text
    assert 'mlxd_app_requests_total{app="indexer",model="tiny"}' in indexer
    assert 'app="editor"' not in indexer, "another app's usage is not the indexer's to read"
    assert 'mlxd_requests_total{model="tiny"' in indexer, "its own model's figures stay"
    stranger = _get(daemon, "/metrics", STRANGER).text
    others = [line for line in stranger.splitlines() if 'app="' in line and 'app="stranger"' not in line]
    assert 'model="tiny"' not in stranger and not others, "only its own app's line (its requests under way)"
    assert "# TYPE mlxd_app_requests_total counter" in stranger, "the families stay, empty"
    daemon_wide = [line for line in stranger.splitlines() if line and not line.startswith("#") and "{" not in line]
    assert daemon_wide, "figures about the daemon itself stay"
    assert "tiny" in _get(daemon, "/v1/history", EDITOR).json()["models"]
    assert _get(daemon, "/v1/history", STRANGER).json()["models"] == {}


def _text(daemon: Any, key: str, max_tokens: int, stream: bool = False) -> tuple[int, str]:
    status, texts = _choices(daemon, key, max_tokens, stream=stream)
    return status, "".join(texts)


def _choices(daemon: Any, key: str, max_tokens: int, stream: bool = False, model: str = "tiny",
             n: int = 1) -> tuple[int, list[str]]:
    # n > 1: a list of prompts, the completions route's way to several generations under one lease.
    prompt = "alpha beta gamma delta"
    body = {"model": model, "prompt": prompt if n == 1 else [prompt] * n, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": stream}
    headers = {"authorization": f"Bearer {key}"}
    if not stream:
        answer = httpx.post(daemon.url + "/v1/completions", json=body, headers=headers, timeout=120)
        return answer.status_code, [c["text"] for c in sorted(answer.json()["choices"], key=lambda c: c["index"])]
    parts = [""] * n
    with httpx.stream("POST", daemon.url + "/v1/completions", json=body, headers=headers, timeout=120) as answer:
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    parts[c["index"]] += c["text"]
        return answer.status_code, parts


def test_a_bulk_request_that_has_sent_nothing_gives_its_slot_to_an_interactive_one(daemon):
    """The model's one slot is held by a bulk stream whose first step waits
    on the shared MLX worker (busy with a call, as during another model's
    load); an interactive request takes the slot, and both answers are the
    ones each gets alone."""
    manager, core = daemon.ctx.manager, daemon.ctx.manager.core
    alone_bulk, alone_editor = _text(daemon, BULK, 24), _text(daemon, EDITOR, 6)
    done: list[str] = []

    def timed(label: str, *args: Any) -> tuple[int, str]:
        result = _text(daemon, *args)
        done.append(label)
        return result

    with ThreadPoolExecutor(3) as pool:
        busy, gate = holding_the_worker(daemon, pool)
        try:
            bulk = pool.submit(timed, "bulk", BULK, 24, True)
            wait_until(lambda: any(h.preemptable for h in list(core.holders.values())))
            editor = pool.submit(timed, "editor", EDITOR, 6)
            wait_until(lambda: any(e.kind == "preempt" for e in manager.events.recent()))
            # The interactive request holds the one slot; the bulk one waits again.
            wait_until(lambda: [h.priority for h in list(core.holders.values())] == ["interactive"])
            assert core.queued("tiny") == 1 and core.residents["tiny"].active == 1
        finally:
            gate.set()
        busy.result()
        assert editor.result() == alone_editor
        assert bulk.result() == alone_bulk, "the preempted stream starts over, its client none the wiser"
    assert done == ["editor", "bulk"]


def test_the_generations_of_a_bulk_request_on_a_failover_entry_give_way_together_and_wait_on_their_target(daemon):
    """Two prompts under one lease of `wide` (both its slots), reached through the
    failover entry `pair`: an interactive request for `pair` takes the lease
    back before either generation's first byte; both wait again on
    `wide` and start over, and each answer is the one it gets alone."""
    manager, core = daemon.ctx.manager, daemon.ctx.manager.core
    alone_bulk = _choices(daemon, BULK, 12, stream=True, model="pair", n=2)
    alone_editor = _choices(daemon, EDITOR, 6, model="pair")
    with ThreadPoolExecutor(3) as pool:
        busy, gate = holding_the_worker(daemon, pool)
        try:
            bulk = pool.submit(_choices, daemon, BULK, 12, True, "pair", 2)
            wait_until(lambda: any(h.preemptable and h.slots == 2 for h in list(core.holders.values())))
            editor = pool.submit(_choices, daemon, EDITOR, 6, False, "pair")
            wait_until(lambda: any(e.kind == "preempt" and e.model == "wide" for e in manager.events.recent()))
            wait_until(lambda: [(h.model, h.priority) for h in list(core.holders.values())] == [("wide", "interactive")])
            assert core.queued("wide") == 1 and core.queued("tiny") == 0, "the bulk request waits again on `wide`"
        finally:
            gate.set()
        busy.result()
        assert editor.result() == alone_editor
        assert bulk.result() == alone_bulk, "both generations start over, their client none the wiser"
    assert alone_bulk[0] == 200 and len(alone_bulk[1]) == 2 and all(alone_bulk[1])
