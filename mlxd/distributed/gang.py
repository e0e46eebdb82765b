"""The gang's processes: started, watched and ended by the daemon.

Each rank is ``mlxd.distributed.rank`` in a process group of its own, with
the transport's variables on fresh loopback ports; no ``mlx.launch``. The
daemon writes every request to every rank's stdin and reads each rank's
event channel; the liveness core
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
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mlxd.distributed import wire
from mlxd.distributed.liveness import Deadlines, Failure, GangLiveness, Phase
from mlxd.distributed.processes import LocalRank
from mlxd.errors import ModelLoadFailed
from mlxd.registry.parallel import LOCAL

if TYPE_CHECKING:
    # Imported where a rank on another host is reserved: a daemon without one
    # never loads httpx (and the rich console its CLI pulls in) at start.
    import httpx

    from mlxd.distributed.remote_rank import RemoteRank

log = logging.getLogger("mlxd.distributed")

# Between TERM and SIGKILL: a rank in a collective never reaches a handler,
# so there is little point in waiting long.
TERM_GRACE_S = 1.0
# How often the watchdog asks for a verdict at most.
WATCH_S = 0.25


@dataclass(frozen=True)
class GangPlan:
    """What to start: the model folder, how it is split and over what, and
    for a rank on another host, that host's mlxd (its /v1 root and key)."""

    name: str
    path: Path
    mode: str
    hosts: tuple[str, ...]
    transport: str
    deadlines: Deadlines
    eos: tuple[int, ...]
    remotes: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)
    # Where this machine's ranks save their kept KV caches (None: memory only).
    cache_folder: Path | None = None
    # The most requests the ranks decode side by side (the entry's max_concurrency).
    max_batch: int = 1
    # jaccl: the RDMA device joining rank i's host to rank j's.
    rdma_devices: tuple[tuple[str | None, ...], ...] | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(transport: str, rank: int, size: int, ports: list[int], hostfile: Path,
             coordinator: str = "") -> dict[str, str]:
    """The variables MLX's transport reads for one local rank (what
    ``mlx.launch`` would set), pure but for the hostfile's path: for jaccl,
    the file of RDMA device names, and rank 0's address, where the others
    meet it."""
    env = {"MLX_RANK": str(rank), "MLX_WORLD_SIZE": str(size)}
    if transport == "nccl":
        env |= {"NCCL_HOST_IP": "127.0.0.1", "NCCL_PORT": str(ports[0]), "CUDA_VISIBLE_DEVICES": str(rank)}
    elif transport == "jaccl":
        # The CPU drives RDMA; without the fast GPU-CPU sync every step waits on it.
        env |= {"MLX_IBV_DEVICES": str(hostfile), "MLX_JACCL_COORDINATOR": coordinator,
                "MLX_METAL_FAST_SYNCH": "1"}
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
        self._ranks: list[RankHandle] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribers: dict[str, asyncio.Queue[dict[str, Any] | Failure]] = {}
        self._ready = asyncio.Event()
        # Whether the model's KV cache can be trimmed (rank 0 says, once loaded).
        self.trimmable = True
        self.failed: asyncio.Future[Failure] = asyncio.get_running_loop().create_future()
        self.idle = asyncio.Event()
        self.idle.set()
        self.in_flight = 0  # requests sent whose end rank 0 has not reported
        sweep_orphaned_folders(Path(tempfile.gettempdir()))
        self._dir = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self._stopping = False
        # Ranks other hosts reserved for this gang, started or not.
        self._reserved: dict[int, RemoteRank] = {}

    # --- start ------------------------------------------------------------------

    async def start(self) -> None:
        """Start every rank (here, or by the mlxd of its host) and wait until
        each has passed the load barrier. Raises ModelLoadFailed naming the
        rank that did not (the gang is stopped first: nothing half-resident)."""
        try:
            await self._spawn()
            for rank, handle in enumerate(self._ranks):
                self._tasks.append(asyncio.create_task(self._read(rank, handle), name=f"gang-{rank}"))
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

    async def _spawn(self) -> None:
        size = len(self.plan.hosts)
        remote: dict[int, RemoteRank] = {}
        self._reserved = remote  # given back by stop() if the start goes no further
        for rank, host in enumerate(self.plan.hosts):
            if host != LOCAL:
                # Here: an all-local gang's load never imports httpx.
                import httpx

                from mlxd.distributed.remote_rank import RemoteRank

                url, key = self.plan.remotes[host]
                body = {"model": self.plan.name, "rank": rank, "size": size, "mode": self.plan.mode,
                        "transport": self.plan.transport, "eos": list(self.plan.eos),
                        "load_timeout_s": self.plan.deadlines.load_s}
                try:
                    remote[rank] = await RemoteRank.reserve(url, key, body, f"{self.plan.name} rank {rank}")
                except httpx.HTTPError as exc:
                    raise ModelLoadFailed(f"The parallel model `{self.plan.name}` could not start: rank {rank}'s "
                                          f"host `{host}` refused it ({describe_http(exc)}).") from exc
        local_ip = route_ip(next(iter(remote.values())).address) if remote else "127.0.0.1"
        ports = [0 if rank in remote else free_port() for rank in range(size)]
        hosts = [[remote[r].address] if r in remote else [f"{local_ip}:{ports[r]}"] for r in range(size)]
        jaccl: dict[str, Any] = {}
        if self.plan.transport == "jaccl":
            # Rank 0 (here) is the coordinator; the device names are each host's own.
            jaccl = {"coordinator": f"{local_ip}:{free_port()}", "devices": self.plan.rdma_devices}
            hostfile = self._dir / "devices.json"
            hostfile.write_text(json.dumps(jaccl["devices"]))
        else:
            hostfile = self._dir / "hosts.json"
            hostfile.write_text(json.dumps(hosts))
        base = {
            **os.environ,
            "MLXD_GANG_PATH": str(self.plan.path),
            "MLXD_GANG_MODE": self.plan.mode,
            "MLXD_GANG_BACKEND": self.plan.transport,
            "MLXD_GANG_EOS": json.dumps(list(self.plan.eos)),
            # Read by rank 0 alone: it decides when the others take a request.
            "MLXD_GANG_MAX_BATCH": str(self.plan.max_batch),
            # A rank ends itself past it: the daemon that would end it may be gone.
            "MLXD_GANG_LOAD_TIMEOUT_S": str(self.plan.deadlines.load_s),
        }
        if self.plan.cache_folder is not None:
            base["MLXD_GANG_CACHE_DIR"] = str(self.plan.cache_folder)
        for rank in range(size):
            if rank in remote:
                handle: RankHandle = remote[rank]
                self._ranks.append(handle)
                await remote[rank].start(hosts, jaccl)
            else:
                env = base | rank_env(self.plan.transport, rank, size, ports, hostfile, jaccl.get("coordinator", ""))
                handle = await LocalRank.spawn(env, f"{self.plan.name} rank {rank}")
                self._ranks.append(handle)
            self.liveness.spawned(rank, handle.pid or 0, self._clock())

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
            self.in_flight += 1
            self.idle.clear()
            self.liveness.work_sent(self._clock())
        for handle in self._ranks:
            await handle.send(line)

    async def ask_all(self, message: dict[str, Any], timeout: float) -> list[dict[str, Any]] | None:
        """Every rank's answer to ``message`` (one event each, under the
        message's ``id``), sent while the gang is idle; None when the gang
        fails, a rank does not answer within ``timeout`` seconds, or the OS
        shows a rank stopped (one that never will: an unload, or an eviction
        another model waits for, would otherwise wait out the timeout)."""
        rid = str(message["id"])
        inbox = self.subscribe(rid)
        answers: list[dict[str, Any]] = []
        try:
            await self.send_all(message)
            async with asyncio.timeout(timeout):
                while len(answers) < len(self._ranks):
                    try:
                        event = await asyncio.wait_for(inbox.get(), WATCH_S)
                    except TimeoutError:
                        if stopped := self._os_stopped():
                            log.warning("%s: rank %d is stopped (SIGSTOP); not waiting for its answer",
                                        self.plan.name, min(stopped))
                            return None
                        continue
                    if isinstance(event, Failure):
                        return None
                    answers.append(event)
        except TimeoutError:
            return None
        finally:
            self.unsubscribe(rid)
        return answers

    async def send_leader(self, message: dict[str, Any]) -> None:
        """A message only rank 0 reads (a cancel: the followers learn of it
        from rank 0's next decision)."""
        if self._ranks:
            await self._ranks[0].send(wire.encode(message).encode())

    # --- readers -------------------------------------------------------------------

    async def _read(self, rank: int, handle: RankHandle) -> None:
        while line := await handle.readline():
            message = wire.decode(line)
            if message is not None:
                self._on_event(rank, message)
        code = await handle.wait()
        if self.liveness.expects_exit():
            return
        if code > 0:
            # It ended itself: perhaps because a peer died first (Deadlines.echo_s).
            tail = handle.last_words()
            self.liveness.suspect(rank, describe_exit(code) + (f" ({tail})" if tail else ""), self._clock())
            return
        self._fail(rank, describe_exit(code))

    def _on_event(self, rank: int, message: dict[str, Any]) -> None:
        now = self._clock()
        kind = message.get("ev")
        live = self.liveness
        if kind == "phase":
            phase = {"load": Phase.LOADING, "prefill": Phase.PREFILL}.get(str(message.get("phase")))
            if phase is not None:
                live.progress(rank, phase, now)
            if rank == 0 and "id" in message:
                self._deliver(message)  # how much of the prompt its cache held
        elif kind == "ready":
            live.progress(rank, Phase.READY, now, memory_bytes=int(message.get("memory_bytes") or 0))
            if rank == 0:
                self.trimmable = bool(message.get("trimmable", True))
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
            # A rank with rows still decoding (or prefilling) owes the next step.
            live.progress(rank, Phase.DECODE if message.get("busy") else Phase.READY, now)
            if rank == 0:
                self._deliver(message)
                self.in_flight = max(0, self.in_flight - 1)
                if self.in_flight == 0:
                    live.work_done(now)
                    self.idle.set()
        elif kind in ("saved", "restored"):
            self._deliver(message)  # every rank's answer to ask_all
        elif kind == "failed":
            why = f"failed while {message.get('phase', 'running')}: {message.get('error', '?')}"
            live.suspect(rank, why, now)

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
        """Local ranks the OS shows stopped (SIGSTOP): one that owes progress fails the gang."""
        import psutil

        found = set()
        for rank, handle in enumerate(self._ranks):
            if isinstance(handle, LocalRank) and handle.pid is not None:
                with contextlib.suppress(psutil.Error):
                    if psutil.Process(handle.pid).status() == psutil.STATUS_STOPPED:
                        found.add(rank)
        return frozenset(found)

    # --- stop ---------------------------------------------------------------------------

    async def _kill_all(self) -> None:
        self.liveness.stopped()
        for handle in self._ranks:
            handle.send_signal(signal.SIGCONT)  # a stopped rank cannot act on TERM
            handle.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(h.wait()) for h in self._ranks]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=TERM_GRACE_S)
            if pending:
                for handle in self._ranks:
                    handle.send_signal(signal.SIGKILL)
                await asyncio.wait(pending, timeout=5.0)

    async def stop(self) -> None:
        """End every rank (an unload, or the end of a failed gang) and wait
        for them; then the readers and the watchdog."""
        self._stopping = True
        self.liveness.stopped()
        for handle in self._ranks:
            await handle.send(wire.encode({"op": "exit"}).encode())
            handle.close_input()
        await self._kill_all()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle in {*self._reserved.values(), *(h for h in self._ranks if not isinstance(h, LocalRank))}:
            await handle.aclose()
        with contextlib.suppress(OSError):
            for f in self._dir.iterdir():
                f.unlink()
            self._dir.rmdir()


# A gang's host file folder, named by the daemon that made it: one killed
# (SIGKILL, the OOM killer) never removed its own.
FOLDER_PREFIX = "mlxd-gang-"


def sweep_orphaned_folders(parent: Path) -> int:
    """Remove the gang folders under ``parent`` whose daemon is gone; how many."""
    removed = 0
    for folder in parent.glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name[len(FOLDER_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive, and not ours to judge
    return True


class RankHandle(Protocol):
    """A rank as the gang drives it, here (LocalRank) or on another host (RemoteRank)."""

    pid: int | None

    async def send(self, data: bytes) -> None: ...
    async def readline(self) -> bytes: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: signal.Signals) -> None: ...
    def close_input(self) -> None: ...
    def last_words(self) -> str: ...


def route_ip(address: str) -> str:
    """This machine's address as seen from ``address`` (host:port): where
    the other hosts' ranks reach the local ones."""
    host = address.rsplit(":", 1)[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def describe_http(exc: httpx.HTTPError) -> str:
    """An mlxd's refusal in its own words (its error body's message)."""
    import httpx

    if not isinstance(exc, httpx.HTTPStatusError):
        return type(exc).__name__
    said = exc.response.text[:300]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        said = str(exc.response.json()["error"]["message"])[:300]
    return f"HTTP {exc.response.status_code}: {said}"
