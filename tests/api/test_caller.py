"""Who is asking is found once, at the gatekeeper, from the key the request
used, and the request log names it (by the key's name, never the key)."""

from __future__ import annotations

import logging

from support.echo_engine import echo_daemon

KEYS = ["sk-first", "sk-second"]


def test_the_request_log_names_the_callers_key_and_never_the_key(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd.requests")
    with echo_daemon(tmp_path, server={"api_keys": KEYS}) as daemon, daemon.client() as client:
        ask = {"model": "echo-a", "messages": [{"role": "user", "content": "who am I"}]}
        refused = client.post("/v1/chat/completions", json=ask, headers={"authorization": "Bearer sk-third"})
        assert refused.status_code == 401
        answered = client.post("/v1/chat/completions", json=ask, headers={"authorization": "Bearer sk-second"})
        assert answered.status_code == 200, answered.text
    lines = [r.getMessage() for r in caplog.records if r.name == "mlxd.requests" and "status=200" in r.getMessage()]
    assert len(lines) == 1 and " caller=key-2 " in lines[0]
    assert not any("sk-" in r.getMessage() for r in caplog.records)
