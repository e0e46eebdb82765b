from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients.forcing_proxy import NOTE
from support.daemon import daemon_process


@pytest.fixture(scope="package")
def demo(tmp_path_factory):
    """The demo registry as `mlxd demo` writes it, served once for every client test."""
    from mlxd.cli.demo import write_demo

    tmp = tmp_path_factory.mktemp("clients")
    with daemon_process(write_demo(tmp / "demo", sizes=("tiny",)), tmp) as daemon:
        yield daemon


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A client's HOME and project folder, with ``note.txt`` (the file the
    forcing proxy makes it read) in it, at a short path: the forced call
    writes the note's full path (Qwen Code takes absolute paths only, and
    none outside its workspace) token by token within the answer cap."""
    folder = Path(tempfile.mkdtemp(prefix="c", dir="/tmp"))
    (folder / "note.txt").write_text(NOTE)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
