"""A gang's host-file folder outlives a daemon killed with SIGKILL (or by
the OOM killer): the next gang's start removes the folders of daemons that
are gone, and only those."""

from __future__ import annotations

import os
import subprocess
import sys

from mlxd.distributed.gang import FOLDER_PREFIX, sweep_orphaned_folders


def test_the_folders_of_gone_daemons_are_removed_and_no_others(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"{FOLDER_PREFIX}{gone.pid}-a1b2"
    orphan.mkdir()
    (orphan / "hosts.json").write_text("[]")
    mine = tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-c3d4"
    mine.mkdir()
    older = tmp_path / f"{FOLDER_PREFIX}e5f6"  # named before the pid was in the name: whose, nobody knows
    older.mkdir()
    assert sweep_orphaned_folders(tmp_path) == 1
    assert not orphan.exists() and mine.exists() and older.exists()
