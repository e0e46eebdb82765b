"""The gang's processes: started, watched and ended by the daemon.

Each rank is ``python -m mlxd.distributed.rank`` in a session (and process
group) of its own, with the transport's variables on fresh loopback ports;
no ``mlx.launch``. The daemon writes every request to every rank's stdin and
reads each rank's event channel; the liveness core
(``distributed/liveness.py``) turns those reports and the clock into a
verdict, and a watchdog asks for it. On any verdict, or any rank's exit, the
whole gang is ended: TERM to every rank's process group, SIGKILL shortly
after, so nothing is left half-resident.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.distributed import wire
from mlxd.distributed.liveness import Deadlines, Failure, GangLiveness, Phase
from mlxd.errors import ModelLoadFailed

log = logging.getLogger("mlxd.distributed")

# Between TERM and SIGKILL: a rank in a collective never reaches a handler,
# so there is little point in waiting long.
TERM_GRACE_S = 1.0
# How often the watchdog asks for a verdict at most.
WATCH_S = 0.25


@dataclass(frozen=True)
class GangPlan:
    """What to start: the model folder, how it is split and over what."""

    name: str
    path: Path
    mode: str
    hosts: tuple[str, ...]
    transport: str
    deadlines: Deadlines
    eos: tuple[int, ...]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(transport: str, rank: int, size: int, ports: list[int], hostfile: Path) -> dict[str, str]:
    """The variables MLX's transport reads for one local rank (what
    ``mlx.launch`` would set), pure but for the hostfile's path."""
    env = {"MLX_RANK": str(rank), "MLX_WORLD_SIZE": str(size)}
    if transport == "nccl":
        env |= {"NCCL_HOST_IP": "127.0.0.1", "NCCL_PORT": str(ports[0]), "CUDA_VISIBLE_DEVICES": str(rank)}
    else:
        env["MLX_HOSTFILE"] = str(hostfile)
    return env


def hostfile_text(ports: list[int]) -> str:
    """The ring backend's hostfile: one list of addresses per rank."""
    return json.dumps([[f"127.0.0.1:{p}"] for p in ports])


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class Gang:
    """One start of a gang: its processes, their channels and its liveness.
    A gang that failed or stopped is never started again: the next load
    makes a fresh one on fresh ports."""

    def __init__(self, plan: GangPlan, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan = plan
        self._clock = clock
        self.liveness = GangLiveness.starting(list(plan.hosts), plan.deadlines, clock())
        self._procs: list[asyncio.subprocess.Process] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stderr: list[deque[str]] = [deque(maxlen=5) for _ in plan.hosts]
        self._subscribers: dict[str, asyncio.Queue[dict[str, Any] | Failure]] = {}
        self._ready = asyncio.Event()
        self.failed: asyncio.Future[Failure] = asyncio.get_running_loop().create_future()
        self.idle = asyncio.Event()
        self.idle.set()
        self._dir = Path(tempfile.mkdtemp(prefix="mlxd-gang-"))
        self._stopping = False

    # --- start ------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn every rank and wait until each has passed the load barrier.
        Raises ModelLoadFailed naming the rank that did not (the gang is
        stopped first: nothing half-resident)."""
        size = len(self.plan.hosts)
        ports = [free_port() for _ in range(size)]
        hostfile = self._dir / "hosts.json"
        hostfile.write_text(hostfile_text(ports))
        base = {
            **os.environ,
            "MLXD_GANG_PATH": str(self.plan.path),
            "MLXD_GANG_MODE": self.plan.mode,
            "MLXD_GANG_BACKEND": self.plan.transport,
            "MLXD_GANG_EOS": json.dumps(list(self.plan.eos)),
        }
        try:
            for rank in range(size):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "mlxd.distributed.rank",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, start_new_session=True,
                    env=base | rank_env(self.plan.transport, rank, size, ports, hostfile),
                )
                self._procs.append(proc)
                self.liveness.spawned(rank, proc.pid, self._clock())
            for rank, proc in enumerate(self._procs):
                self._tasks.append(asyncio.create_task(self._read(rank, proc), name=f"gang-{rank}"))
                self._tasks.append(asyncio.create_task(self._read_stderr(rank, proc), name=f"gang-err-{rank}"))
            self._tasks.append(asyncio.create_task(self._watch(), name=f"gang-watch-{self.plan.name}"))
            ready = asyncio.ensure_future(self._ready.wait())
            await asyncio.wait({ready, self.failed}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
        except BaseException:
            await self.stop()
            raise
        if self.failed.done():
            failure = self.failed.result()
            await self.stop()
            raise ModelLoadFailed(f"The parallel model `{self.plan.name}` could not start: {failure.sentence()}.")

    # --- channels ------------------------------------------------------------------

    def subscribe(self, rid: str) -> asyncio.Queue[dict[str, Any] | Failure]:
        q: asyncio.Queue[dict[str, Any] | Failure] = asyncio.Queue()
        if self.failed.done():
            q.put_nowait(self.failed.result())
        self._subscribers[rid] = q
        return q

    def unsubscribe(self, rid: str) -> None:
        self._subscribers.pop(rid, None)

    async def send_all(self, message: dict[str, Any]) -> None:
        line = wire.encode(message).encode()
        if message.get("op") == "generate":
            self.idle.clear()
            self.liveness.work_sent(self._clock())
        for proc in self._procs:
            if proc.stdin is None or proc.stdin.is_closing():
                continue
            with contextlib.suppress(ConnectionError, BrokenPipeError):
                proc.stdin.write(line)
                await proc.stdin.drain()

    async def send_leader(self, message: dict[str, Any]) -> None:
        """A message only rank 0 reads (a cancel: the followers learn of it
        from rank 0's next decision)."""
        proc = self._procs[0] if self._procs else None
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            proc.stdin.write(wire.encode(message).encode())
            await proc.stdin.drain()

    # --- readers -------------------------------------------------------------------

    async def _read(self, rank: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue
            if not line:
                break
            message = wire.decode(line)
            if message is not None:
                self._on_event(rank, message)
        code = await proc.wait()
        if not self.liveness.expects_exit():
            why = describe_exit(code)
            tail = self._stderr[rank][-1] if self._stderr[rank] else ""
            self._fail(rank, f"{why}" + (f" ({tail})" if tail and code > 0 else ""))

    async def _read_stderr(self, rank: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if text:
                self._stderr[rank].append(text[:300])
                log.debug("%s rank %d: %s", self.plan.name, rank, text)

    def _on_event(self, rank: int, message: dict[str, Any]) -> None:
        now = self._clock()
        kind = message.get("ev")
        live = self.liveness
        if kind == "phase":
            phase = {"load": Phase.LOADING, "prefill": Phase.PREFILL}.get(str(message.get("phase")))
            if phase is not None:
                live.progress(rank, phase, now)
        elif kind == "ready":
            live.progress(rank, Phase.READY, now, memory_bytes=int(message.get("memory_bytes") or 0))
            if live.ready:
                self._ready.set()
        elif kind == "progress":
            phase = Phase.PREFILL if message.get("phase") == "prefill" else Phase.DECODE
            live.progress(rank, phase, now)
        elif kind == "token":
            live.progress(rank, Phase.DECODE, now)
            self._deliver(message)
        elif kind == "end":
            peak = message.get("peak_bytes")
            r = live.ranks[rank]
            if isinstance(peak, int) and peak > (r.memory_bytes or 0):
                r.memory_bytes = peak
            live.progress(rank, Phase.READY, now)
            if rank == 0:
                live.work_done(now)
                self._deliver(message)
                self.idle.set()
        elif kind == "failed":
            self._fail(rank, f"failed while {message.get('phase', 'running')}: {message.get('error', '?')}")

    def _deliver(self, message: dict[str, Any]) -> None:
        q = self._subscribers.get(str(message.get("id")))
        if q is not None:
            q.put_nowait(message)

    # --- failure ------------------------------------------------------------------------

    def _fail(self, rank: int, reason: str) -> None:
        failure = self.liveness.rank_failed(rank, reason)
        self._declare(failure)

    def _declare(self, failure: Failure) -> None:
        if self.failed.done():
            return
        log.error("parallel model %s failed: %s; ending every rank", self.plan.name, failure.sentence())
        self.failed.set_result(failure)
        for q in self._subscribers.values():
            q.put_nowait(failure)
        self.idle.set()
        asyncio.ensure_future(self._kill_all())

    async def _watch(self) -> None:
        while not self.failed.done():
            now = self._clock()
            deadline = self.liveness.next_deadline()
            wait = WATCH_S if deadline is None else min(WATCH_S, max(0.01, deadline - now))
            await asyncio.sleep(wait)
            if self._stopping:
                return
            failure = self.liveness.check(self._clock(), self._os_stopped())
            if failure is not None:
                self._declare(failure)

    def _os_stopped(self) -> frozenset[int]:
        """Ranks the OS shows stopped (SIGSTOP): only asked when someone is late."""
        import psutil

        found = set()
        for rank, proc in enumerate(self._procs):
            with contextlib.suppress(psutil.Error):
                if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
                    found.add(rank)
        return frozenset(found)

    # --- stop ---------------------------------------------------------------------------

    async def _kill_all(self) -> None:
        self.liveness.stopped()
        for proc in self._procs:
            _signal_group(proc, signal.SIGCONT)  # a stopped rank cannot act on TERM
            _signal_group(proc, signal.SIGTERM)
        waits = [asyncio.ensure_future(p.wait()) for p in self._procs]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=TERM_GRACE_S)
            if pending:
                for proc in self._procs:
                    _signal_group(proc, signal.SIGKILL)
                await asyncio.wait(pending, timeout=5.0)

    async def stop(self) -> None:
        """End every rank (an unload, or the end of a failed gang) and wait
        for them; then the readers and the watchdog."""
        self._stopping = True
        self.liveness.stopped()
        for proc in self._procs:
            if proc.stdin is not None and not proc.stdin.is_closing():
                with contextlib.suppress(Exception):
                    proc.stdin.write(wire.encode({"op": "exit"}).encode())
                    proc.stdin.close()
        await self._kill_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(OSError):
            for f in self._dir.iterdir():
                f.unlink()
            self._dir.rmdir()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]


def _signal_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
