"""Ranks this mlxd runs for a gang whose daemon is elsewhere (another
machine's mlxd, reaching this one as a backend of ``kind: mlxd``): each is a
local rank process with the weights read from this machine's own path for
the model, its events streamed to that daemon, and ended as soon as the
daemon stops reading them (it died, or ended the gang), or, if that daemon
never comes to read them (it died between reserving and following the
rank), once the gang's load deadline has passed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxd.distributed.gang import TERM_GRACE_S, free_port, rank_env
from mlxd.distributed.liveness import Deadlines
from mlxd.distributed.processes import LocalRank
from mlxd.errors import BadRequest, CapacityUnavailable, RequestNotFound
from mlxd.registry.schema import rdma_devices_problem

GB = 1024**3

log = logging.getLogger("mlxd.distributed")


@dataclass
class Hosted:
    id: str
    env: dict[str, str]
    rank: int
    size: int
    transport: str
    port: int
    folder: Path
    process: LocalRank | None = None
    # Its estimated share of the model's memory, held against this host's budget.
    share_bytes: int = field(default=0)
    # Whether its daemon reads its events; until then it expires (``expiry``).
    followed: bool = False
    expiry: asyncio.TimerHandle | None = None


class RankHosting:
    def __init__(self) -> None:
        self._ranks: dict[str, Hosted] = {}

    @property
    def held_bytes(self) -> int:
        """What the hosted ranks hold of this host's memory (their estimates)."""
        return sum(h.share_bytes for h in self._ranks.values())

    def reserve(self, path: Path, body: dict[str, Any], host_ip: str, *, model_bytes: int = 0,
                free_bytes: int | None = None) -> dict[str, Any]:
        """A rank's address on this machine (a free port), to be started
        once the daemon knows every rank's address. Its share of the model
        (``model_bytes`` over the rank count) must fit in what this host's
        budget has free beside its own models and the ranks it hosts."""
        rank, size = int(body.get("rank", -1)), int(body.get("size", 0))
        transport = str(body.get("transport", "ring"))
        if not 0 < rank < size or transport not in ("ring", "jaccl"):
            raise BadRequest("a hosted rank is rank 1 or later of a gang over `ring` or `jaccl`", param="rank")
        share = model_bytes // size
        if free_bytes is not None and share > free_bytes - self.held_bytes:
            free = max(0, free_bytes - self.held_bytes)
            raise CapacityUnavailable(
                f"This host cannot take rank {rank}: its share needs {share / GB:.2f} GB and "
                f"{free / GB:.2f} GB of the budget is free.", retry_after=30)
        deadline = _load_deadline(body.get("load_timeout_s"))
        port = free_port()
        folder = Path(tempfile.mkdtemp(prefix="mlxd-hosted-rank-"))
        env = {
            "MLXD_GANG_PATH": str(path),
            "MLXD_GANG_MODE": str(body.get("mode", "tensor")),
            "MLXD_GANG_BACKEND": transport,
            "MLXD_GANG_EOS": json.dumps([int(t) for t in body.get("eos", [])]),
            "MLXD_GANG_LOAD_TIMEOUT_S": str(deadline),
        }
        hosted = Hosted(secrets.token_hex(8), env, rank, size, transport, port, folder, share_bytes=share)
        self._ranks[hosted.id] = hosted
        # A daemon that died before following the rank would hold its share of
        # this host's budget (and the rank) for good.
        hosted.expiry = asyncio.get_running_loop().call_later(deadline, self._expire, hosted.id)
        return {"id": hosted.id, "address": f"{host_ip}:{port}"}

    def _get(self, rank_id: str) -> Hosted:
        hosted = self._ranks.get(rank_id)
        if hosted is None:
            raise RequestNotFound(f"No hosted rank `{rank_id}`.")
        return hosted

    async def start(self, rank_id: str, hosts: list[list[str]], coordinator: str = "",
                    devices: list[list[str | None]] | None = None) -> dict[str, Any]:
        """Start the rank with every rank's address; over jaccl, with rank
        0's address (``coordinator``) and the RDMA device names (``devices``,
        one row per rank) instead."""
        hosted = self._get(rank_id)
        if hosted.process is not None:
            raise BadRequest("this rank has started already", param="hosts")
        if len(hosts) != hosted.size:
            raise BadRequest(f"a gang of {hosted.size} ranks needs {hosted.size} hosts", param="hosts")
        if hosted.transport == "jaccl":
            problem = rdma_devices_problem(devices, hosted.size)
            if not coordinator or problem:
                raise BadRequest(f"a jaccl rank needs `coordinator` and `devices`: {problem or 'no coordinator'}",
                                 param="devices")
            hostfile = hosted.folder / "devices.json"
            hostfile.write_text(json.dumps(devices))
        else:
            hostfile = hosted.folder / "hosts.json"
            hostfile.write_text(json.dumps(hosts))
        env = {**os.environ, **hosted.env,
               **rank_env(hosted.transport, hosted.rank, hosted.size, [], hostfile, coordinator)}
        hosted.process = await LocalRank.spawn(env, f"hosted rank {hosted.rank}")
        return {"pid": hosted.process.pid}

    async def events(self, rank_id: str) -> AsyncIterator[bytes]:
        """The rank's event lines, then one exit line; the rank ends when the
        reader goes away (however the stream ends)."""
        hosted = self._get(rank_id)
        process = hosted.process
        if process is None:
            raise BadRequest("start the rank first", param="id")
        hosted.followed = True
        try:
            while line := await process.readline():
                yield line
            code = await process.wait()
            yield (json.dumps({"ev": "exit", "code": code, "stderr": process.last_words()}) + "\n").encode()
        finally:
            await self.end(rank_id)

    async def send(self, rank_id: str, data: bytes) -> None:
        process = self._get(rank_id).process
        if process is not None:
            await process.send(data)

    def signal(self, rank_id: str, name: str) -> None:
        process = self._get(rank_id).process
        try:
            sig = signal.Signals[name]
        except KeyError:
            raise BadRequest(f"unknown signal {name!r}", param="signal") from None
        if process is not None:
            process.send_signal(sig)

    def _expire(self, rank_id: str) -> None:
        hosted = self._ranks.get(rank_id)
        if hosted is not None and not hosted.followed:
            log.warning("hosted rank %d (%s): its daemon never followed it; ending it", hosted.rank, rank_id)
            asyncio.ensure_future(self.end(rank_id))

    async def end(self, rank_id: str) -> None:
        hosted = self._ranks.pop(rank_id, None)
        if hosted is None:
            return
        if hosted.expiry is not None:
            hosted.expiry.cancel()
        process = hosted.process
        if process is not None and not process.exited:
            process.send_signal(signal.SIGCONT)
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), TERM_GRACE_S)
            except asyncio.TimeoutError:
                process.send_signal(signal.SIGKILL)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait(), 5.0)
        with contextlib.suppress(OSError):
            for f in hosted.folder.iterdir():
                f.unlink()
            hosted.folder.rmdir()

    async def close(self) -> None:
        await asyncio.gather(*(self.end(i) for i in list(self._ranks)), return_exceptions=True)

    def rows(self) -> list[dict[str, Any]]:
        return [{"id": h.id, "rank": h.rank, "size": h.size, "pid": h.process.pid if h.process else None}
                for h in self._ranks.values()]


def _load_deadline(value: Any) -> float:
    """The gang's load deadline as its daemon sent it (one from before it
    was sent: the default)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return Deadlines().load_s
