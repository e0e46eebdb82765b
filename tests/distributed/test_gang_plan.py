"""The gang's launch plan without processes: each transport's variables
for a local rank, the ring's hostfile, how an exit is described."""

import json
import signal
from pathlib import Path

from mlxd.distributed.gang import describe_exit, hostfile_text, rank_env


def test_ring_ranks_get_their_rank_and_one_hostfile_with_a_port_each():
    ports = [40001, 40002]
    env = rank_env("ring", 1, 2, ports, Path("/tmp/h.json"))
    assert env["MLX_RANK"] == "1" and env["MLX_HOSTFILE"] == "/tmp/h.json"
    assert json.loads(hostfile_text(ports)) == [["127.0.0.1:40001"], ["127.0.0.1:40002"]]


def test_nccl_ranks_get_the_coordinator_and_a_gpu_each():
    env = rank_env("nccl", 1, 2, [40001, 40002], Path("/tmp/h.json"))
    assert env["NCCL_HOST_IP"] == "127.0.0.1" and env["NCCL_PORT"] == "40001"
    assert env["MLX_WORLD_SIZE"] == "2" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "MLX_HOSTFILE" not in env


def test_jaccl_ranks_get_the_coordinator_and_the_device_names_file():
    env = rank_env("jaccl", 1, 2, [], Path("/tmp/devices.json"), "10.0.0.1:40003")
    assert env["MLX_RANK"] == "1" and env["MLX_WORLD_SIZE"] == "2"
    assert env["MLX_JACCL_COORDINATOR"] == "10.0.0.1:40003" and env["MLX_IBV_DEVICES"] == "/tmp/devices.json"
    assert "MLX_HOSTFILE" not in env and "NCCL_HOST_IP" not in env


def test_an_exit_is_told_by_its_signal_or_its_status():
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def test_a_hosts_refusal_is_told_in_its_own_words():
    import httpx

    from mlxd.distributed.gang import describe_http

    request = httpx.Request("POST", "http://peer/v1/gang/ranks")
    body = {"error": {"message": "`m` cannot be loaded on this host: no config.json", "type": "invalid_request_error"}}
    answer = httpx.Response(400, json=body, request=request)
    error = httpx.HTTPStatusError("400", request=request, response=answer)
    assert describe_http(error) == "HTTP 400: `m` cannot be loaded on this host: no config.json"
