"""A gang over two hosts: rank 1 started by a second `mlxd serve` on this
machine acting as another host (a backend of kind mlxd, reached with its
admin key), the weights read from that daemon's own entry for the model."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import mlx.core as mx
import openai
import psutil
import pytest
from support.daemon import daemon_in_thread, wait_until, write_registry

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "Read the configuration file and report the errors"}]
KEY = "peer-admin-key"


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("MLXD_TEST_PEER_KEY", KEY)
    peer_dir, main_dir = tmp_path_factory.mktemp("peer"), tmp_path_factory.mktemp("main")
    peer_registry = write_registry(
        peer_dir, [{"name": "split", "model": "qwen"}, {"name": "thunder", "model": "qwen"},
                   {"name": "elsewhere", "path": str(peer_dir / "no-such-model")},
                   {"name": "huge", "model": "qwen", "estimated_memory_gb": 0.9}],
        manager={"memory_budget": "1GB"}, server={"api_keys": [KEY]},
    )
    with daemon_in_thread(peer_registry, peer_dir) as peer:
        registry = write_registry(
            main_dir,
            [{"name": "solo", "model": "qwen"},
             {"name": "split", "model": "qwen", "parallel": {"ranks": ["local", "peer"], "step_timeout_s": 3}},
             # Here its weights are found; on the other host they are not.
             {"name": "elsewhere", "model": "qwen", "parallel": {"ranks": ["local", "peer"]}},
             # Thunderbolt RDMA between the two hosts (which this Linux machine's MLX lacks).
             {"name": "thunder", "model": "qwen",
              "parallel": {"ranks": ["local", "peer"], "transport": "jaccl",
                           "rdma_devices": [[None, "rdma_en5"], ["rdma_en4", None]]}}],
            backends={"peer": {"url": f"{peer.url}/v1", "kind": "mlxd", "api_key_env": "MLXD_TEST_PEER_KEY"}},
        )
        with daemon_in_thread(registry, main_dir) as main:
            yield main, peer
    mp.undo()


def test_a_rank_started_by_another_hosts_mlxd_serves_the_same_text(daemons):
    main, peer = daemons
    client = openai.OpenAI(base_url=f"{main.url}/v1", api_key="unused", max_retries=0)
    ask = dict(messages=CHAT, max_tokens=16, temperature=0)
    solo = client.chat.completions.create(model="solo", **ask).choices[0].message.content
    assert client.chat.completions.create(model="split", **ask).choices[0].message.content == solo
    ranks = main.model("split")["ranks"]
    assert [(r["rank"], r["host"]) for r in ranks] == [(0, "local"), (1, "peer")]
    hosted = peer.ctx.hosting.rows()
    assert [(h["rank"], h["pid"]) for h in hosted] == [(1, ranks[1]["pid"])]
    # Unloading ends the rank on the other host too.
    with main.client() as http:
        assert http.post("/v1/models/split/unload", json={}).status_code == 200
    wait_until(lambda: peer.ctx.hosting.rows() == [], timeout=10)
    assert not psutil.pid_exists(ranks[1]["pid"]) or psutil.Process(ranks[1]["pid"]).status() == psutil.STATUS_ZOMBIE


def test_the_hosting_routes_need_the_hosts_admin_key_and_room_in_its_budget(daemons):
    _, peer = daemons
    ask = {"model": "split", "rank": 1, "size": 2}
    with peer.client() as http:
        assert http.post("/v1/gang/ranks", json=ask).status_code == 401
        admin = {"Authorization": f"Bearer {KEY}"}
        # The peer's budget is 1 GB: two halves of `huge` (0.9 GB) fit, a third does not.
        held = [http.post("/v1/gang/ranks", json={**ask, "model": "huge"}, headers=admin) for _ in range(2)]
        assert [a.status_code for a in held] == [200, 200]
        assert all(a.json()["address"].startswith("127.0.0.1:") for a in held)
        third = http.post("/v1/gang/ranks", json={**ask, "model": "huge"}, headers=admin)
        assert third.status_code == 503 and "cannot take rank 1" in third.json()["error"]["message"]
        # Reservations never started are given back.
        for answer in held:
            assert http.delete(f"/v1/gang/ranks/{answer.json()['id']}", headers=admin).status_code == 200
        assert peer.ctx.hosting.rows() == [] and peer.ctx.hosting.held_bytes == 0


def test_a_reservation_its_daemon_never_follows_is_given_back_after_the_load_deadline(daemons):
    # The daemon that reserved died before starting (or following) its rank:
    # the reservation held its share of this host's budget for good, and
    # every later gang was refused here ("cannot take rank 1").
    _, peer = daemons
    admin = {"Authorization": f"Bearer {KEY}"}
    ask = {"model": "huge", "rank": 1, "size": 2, "load_timeout_s": 0.5}
    with peer.client(headers=admin) as http:
        assert [http.post("/v1/gang/ranks", json=ask).status_code for _ in range(2)] == [200, 200]
        assert http.post("/v1/gang/ranks", json=ask).status_code == 503
        wait_until(lambda: peer.ctx.hosting.held_bytes == 0, timeout=5)
        again = http.post("/v1/gang/ranks", json=ask)
        assert again.status_code == 200
        assert http.delete(f"/v1/gang/ranks/{again.json()['id']}").status_code == 200


def _failed_load(main, name: str) -> str:
    """Asks for ``name``, whose gang cannot start: a 503, and the model's error."""
    client = openai.OpenAI(base_url=f"{main.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=name, messages=CHAT, max_tokens=4)
    assert refused.value.status_code == 503
    model = main.model(name)
    assert model["state"] == "failed"
    return model["last_error"]


def test_a_host_without_the_weights_fails_the_load_naming_the_rank_and_host(daemons):
    error = _failed_load(daemons[0], "elsewhere")
    assert "rank 1" in error and "`peer`" in error and "no-such-model" in error


def test_a_rank_killed_on_the_other_host_takes_the_gang_down(daemons):
    main, peer = daemons
    client = openai.OpenAI(base_url=f"{main.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model="split", messages=CHAT, max_tokens=4000, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    ranks = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            if not ranks and chunk.choices and chunk.choices[0].delta.content:
                ranks = main.model("split")["ranks"]
                os.kill(ranks[1]["pid"], signal.SIGKILL)
    assert "rank 1 was killed by SIGKILL" in str(raised.value)
    wait_until(lambda: main.model("split")["state"] == "failed")
    wait_until(lambda: not psutil.pid_exists(ranks[0]["pid"])
               or psutil.Process(ranks[0]["pid"]).status() == psutil.STATUS_ZOMBIE, timeout=10)
    wait_until(lambda: peer.ctx.hosting.rows() == [], timeout=10)


def test_a_jaccl_rank_is_started_with_mlxs_jaccl_variables_by_the_other_host(daemons):
    """What `mlx.launch --backend jaccl` would set, set by the hosting mlxd:
    the rank, rank 0's address, and a file of the RDMA device names."""
    _, peer = daemons
    admin = {"Authorization": f"Bearer {KEY}"}
    devices = [[None, "rdma_en5"], ["rdma_en4", None]]
    with peer.client() as http:
        reserved = http.post("/v1/gang/ranks", json={"model": "split", "rank": 1, "size": 2, "transport": "jaccl"},
                             headers=admin)
        assert reserved.status_code == 200
        rank_id = reserved.json()["id"]
        start = f"/v1/gang/ranks/{rank_id}/start"
        hosts = [["127.0.0.1:1"], [reserved.json()["address"]]]
        bad = http.post(start, json={"hosts": hosts, "coordinator": "127.0.0.1:9", "devices": [[None]]}, headers=admin)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "devices"
        started = http.post(start, json={"hosts": hosts, "coordinator": "127.0.0.1:9", "devices": devices},
                            headers=admin)
        assert started.status_code == 200
        env = psutil.Process(started.json()["pid"]).environ()
        assert (env["MLX_RANK"], env["MLX_WORLD_SIZE"], env["MLX_JACCL_COORDINATOR"]) == ("1", "2", "127.0.0.1:9")
        assert json.loads(Path(env["MLX_IBV_DEVICES"]).read_text()) == devices
        assert env["MLXD_GANG_BACKEND"] == "jaccl"
        assert http.delete(f"/v1/gang/ranks/{rank_id}", headers=admin).status_code == 200
    assert peer.ctx.hosting.rows() == []


@pytest.mark.skipif(mx.distributed.is_available(backend="jaccl"), reason="this machine has Thunderbolt RDMA")
def test_a_jaccl_gang_on_a_machine_without_rdma_fails_its_load_naming_the_rank_and_why(daemons):
    main, peer = daemons
    error = _failed_load(main, "thunder")
    assert "rank" in error and "Cannot initialize jaccl" in error
    wait_until(lambda: peer.ctx.hosting.rows() == [], timeout=10)
