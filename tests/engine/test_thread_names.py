"""The daemon's threads carry their names into the kernel, where top -H,
ps -L and /proc show them (Python 3.11 names none)."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

from mlxd.engine.worker import MlxWorker
from mlxd.thread_names import name_this_thread

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def kernel_name(native_id: int) -> str:
    return Path(f"/proc/self/task/{native_id}/comm").read_text().strip()


def test_a_thread_that_names_itself_shows_its_python_name_cut_to_the_kernels_15_bytes():
    seen = {}

    def body() -> None:
        name_this_thread()
        seen["name"] = kernel_name(threading.get_native_id())

    thread = threading.Thread(target=body, name="mlx-passes:minilm-l6")
    thread.start()
    thread.join()
    assert seen["name"] == "mlx-passes:mini"


def test_the_mlx_worker_thread_is_named_in_the_kernel():
    async def main() -> str:
        worker = MlxWorker(name="mlx-worker").start()
        try:
            native = await worker.call(threading.get_native_id)
            return kernel_name(native)
        finally:
            await worker.shutdown()

    assert asyncio.run(main()) == "mlx-worker"
