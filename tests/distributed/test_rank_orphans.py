"""A rank outlives no daemon: whatever the rank was doing when its daemon
went (killed, out of memory), it ends. Real rank processes: one with no
daemon (the test holds the pipes a daemon holds, and lets go of them as a
killed daemon does), and a gang of a real daemon process killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
from support.daemon import daemon_process, free_port, tiny_model, wait_until, write_registry

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


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_stopped_rank_ends_when_its_daemon_is_killed(tmp_path):
    # A hung rank (here stopped) reads no EOF: only the kernel can end it, and
    # it does so for a stopped process's group left without its daemon when
    # the group is of the daemon's session (a session of its own stayed for good).
    registry = write_registry(tmp_path, [{"name": "gang", "model": "qwen",
                                          "parallel": {"mode": "tensor", "ranks": 2, "transport": "ring"}}])
    # TMPDIR: the killed daemon cannot remove its gang's hostfile folder.
    with daemon_process(registry, tmp_path, env={"TMPDIR": str(tmp_path)}) as daemon:
        ask = {"model": "gang", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{daemon.url}/v1/chat/completions", json=ask, timeout=60).status_code == 200
        pids = [r["pid"] for r in daemon.model("gang")["ranks"]]
        os.kill(pids[1], signal.SIGSTOP)
        wait_until(lambda: psutil.Process(pids[1]).status() == psutil.STATUS_STOPPED, timeout=5)
        daemon.process.kill()
        daemon.process.wait()
        try:
            wait_until(lambda: all(_gone(p) for p in pids), timeout=ORPHAN_GRACE_S + 5, interval=0.1)
        finally:
            for pid in pids:
                if not _gone(pid):
                    os.kill(pid, signal.SIGKILL)
