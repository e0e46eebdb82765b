from __future__ import annotations

import pytest
from support.daemon import daemon_process


@pytest.fixture(scope="package")
def demo(tmp_path_factory):
    """The demo registry as `mlxd demo` writes it, served once for every client test."""
    from mlxd.cli.demo import write_demo

    tmp = tmp_path_factory.mktemp("clients")
    with daemon_process(write_demo(tmp / "demo", sizes=("tiny",)), tmp) as daemon:
        yield daemon
