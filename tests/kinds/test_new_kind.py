"""A new kind of model is one row of the kinds table and one engine module
(tests/support/echo_engine.py): with nothing else edited, the daemon serves
it on its route, leases it, charges it to the memory budget (evicting for
it) and shows it in /v1/status, and refuses the routes its row leaves out."""

from __future__ import annotations

import threading

import httpx
from support.daemon import wait_until
from support.echo_engine import WITH_ECHO, echo_daemon, echo_folder


def _chat(client: httpx.Client, model: str, text: str) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": text}]})


def test_a_new_kind_is_served_leased_budgeted_and_shown(tmp_path):
    with echo_daemon(tmp_path) as daemon, daemon.client() as client:
        # Its row serves chat only: a completion is the client's 400, and loads nothing.
        refused = client.post("/v1/completions", json={"model": "echo-a", "prompt": "hello"})
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "model" and "echo model" in error["message"]
        assert daemon.model("echo-a")["state"] == "unloaded"

        reply = _chat(client, "echo-a", "say it back")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["choices"][0]["message"]["content"] == "say it back"
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                                 "prompt_tokens_details": {"cached_tokens": 0},
                                 "completion_tokens_details": {"reasoning_tokens": 0}}

        # Held mid-answer: the lease shows in status.
        result: dict[str, httpx.Response] = {}
        asking = threading.Thread(target=lambda: result.setdefault("r", _chat(client, "echo-a", "hold on")))
        asking.start()
        shown = wait_until(lambda: (m := daemon.model("echo-a"))["active_leases"] == 1 and m)
        assert shown["kind"] == "echo" and shown["state"] == "loaded"
        assert shown["memory"]["estimated_bytes"] == int(1.2 * 1024**3)
        daemon.ctx.manager.engine("echo-a").gate.set()
        asking.join(timeout=30)
        assert result["r"].json()["choices"][0]["message"]["content"] == "hold on"
        assert daemon.model("echo-a")["active_leases"] == 0

        # Two of them do not fit the 2 GB budget: the second evicts the first.
        assert _chat(client, "echo-b", "next one").status_code == 200
        status = daemon.status()
        states = {m["name"]: m["state"] for m in status["models"]}
        assert states["echo-b"] == "loaded"
        wait_until(lambda: daemon.model("echo-a")["state"] == "unloaded")
        assert daemon.model("echo-b")["engine"]["answered"] == 1


def test_a_registry_read_without_the_row_names_the_kinds_it_knows(tmp_path):
    from mlxd.errors import ConfigError
    from mlxd.registry.loader import load_registry_text

    folder = echo_folder(tmp_path / "echo")
    text = f"models:\n  - name: e\n    path: {folder}\n    kind: echo\n"
    try:
        load_registry_text(text, tmp_path / "models.yaml")
    except ConfigError as exc:
        assert exc.line == 4 and exc.key == "models[0].kind"
        assert "'text', 'vision', 'embedding', 'rerank', 'transcription' or 'speech'" in exc.detail and "'echo'" in exc.detail
    else:
        raise AssertionError("kind: echo was accepted without its row")
    assert load_registry_text(text, tmp_path / "models.yaml", kinds=WITH_ECHO).models[0].kind == "echo"
