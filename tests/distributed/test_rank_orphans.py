"""A rank outlives no daemon: one whose daemon went (killed, out of memory)
while the rank waited for a peer that never came ends itself past the
gang's load deadline. A real rank process, no daemon: the test holds the
pipes a daemon holds, and lets go of them as a killed daemon does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.daemon import free_port, tiny_model

from mlxd.distributed.rank import ORPHAN_GRACE_S

pytestmark = pytest.mark.mlx


def test_a_rank_waiting_for_a_peer_that_never_came_ends_when_its_daemon_is_gone(tmp_path):
    # Rank 0 of a ring of two whose rank 1 never starts waits in the ring's
    # accept for ever: what a daemon killed early in a gang's start leaves
    # (rank 1 died on its first write to the dead daemon).
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    env = {**os.environ, "MLX_RANK": "0", "MLX_WORLD_SIZE": "2", "MLX_HOSTFILE": str(hostfile),
           "MLXD_GANG_PATH": str(tiny_model()), "MLXD_GANG_MODE": "tensor", "MLXD_GANG_BACKEND": "ring",
           "MLXD_GANG_LOAD_TIMEOUT_S": "1"}
    rank = subprocess.Popen([sys.executable, "-m", "mlxd.distributed.rank"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        assert json.loads(rank.stdout.readline())["phase"] == "load"
        rank.stdin.close()  # the daemon is gone
        rank.stdout.close()
        rank.wait(timeout=1 + ORPHAN_GRACE_S + 10)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
            pytest.fail("the rank outlived its daemon")
