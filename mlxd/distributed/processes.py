"""A rank process on this machine: in a process group of its own (in the
daemon's session), its stdin for commands, its event channel on stdout, the tail of
its stderr kept for the reason it failed. The daemon's gang holds these for
its local ranks; an mlxd hosting a rank for another machine's gang holds one
too (``distributed/hosting.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import deque

log = logging.getLogger("mlxd.distributed")

# The rank's first act is to make its process group, before any import.
RANK_MAIN = "import os, runpy; os.setpgid(0, 0); runpy.run_module('mlxd.distributed.rank', run_name='__main__')"


class LocalRank:
    def __init__(self, proc: asyncio.subprocess.Process, label: str) -> None:
        self._proc = proc
        self.pid: int | None = proc.pid
        self.label = label
        self.stderr_tail: deque[str] = deque(maxlen=5)
        self._stderr = asyncio.ensure_future(self._read_stderr())

    @classmethod
    async def spawn(cls, env: dict[str, str], label: str) -> LocalRank:
        # A group of its own, but not a session of its own: when the daemon
        # dies, a group of the same session left with a stopped member gets
        # SIGHUP and SIGCONT from the kernel, so a stopped (hung) rank ends
        # too instead of staying for good, as it did in a session of its own.
        # The rank makes the group itself (uvloop has no process_group).
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", RANK_MAIN,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env,
        )
        return cls(proc, label)

    @property
    def exited(self) -> bool:
        return self._proc.returncode is not None

    async def send(self, data: bytes) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, BrokenPipeError, RuntimeError):
            stdin.write(data)
            await stdin.drain()

    def close_input(self) -> None:
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            with contextlib.suppress(Exception):
                stdin.close()

    async def readline(self) -> bytes:
        """The next event line; b"" once the rank's channel closed."""
        assert self._proc.stdout is not None
        while True:
            try:
                return await self._proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue  # an oversized line: skipped, the channel goes on

    async def wait(self) -> int:
        code = await self._proc.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._stderr), 1.0)
        return code

    def send_signal(self, sig: signal.Signals) -> None:
        """To the rank's whole process group: whatever it started goes too."""
        if self._proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                os.kill(self._proc.pid, sig)  # so young it has no group of its own yet

    async def _read_stderr(self) -> None:
        stderr = self._proc.stderr
        assert stderr is not None
        while line := await stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if text:
                self.stderr_tail.append(text[:300])
                log.debug("%s: %s", self.label, text)

    def last_words(self) -> str:
        return self.stderr_tail[-1] if self.stderr_tail else ""
