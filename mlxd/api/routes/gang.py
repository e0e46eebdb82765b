"""Ranks this mlxd hosts for another machine's gang (docs/distributed.md):
that machine's daemon reaches this one as a backend of ``kind: mlxd`` with
an admin key, reserves a rank's address, starts it with every rank's
address, writes its commands and reads its events. The weights are read
from this machine's own path for the model (its entry in this registry),
and the rank's share of that entry's footprint must fit in what this host's
budget has free (it is not reserved in this host's residency: a model
loaded here later does not see it). The rank ends when its event stream's
reader goes away."""

from __future__ import annotations

import socket
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from mlxd.api.auth import require_admin
from mlxd.api.context import DaemonContext
from mlxd.errors import BadRequest, ModelNotFound


def _ctx(request: Request) -> DaemonContext:
    return request.app.state.ctx


def router() -> APIRouter:
    api = APIRouter(prefix="/v1/gang/ranks", dependencies=[Depends(require_admin)])

    @api.post("")
    async def reserve(body: dict[str, Any], request: Request) -> dict[str, Any]:
        ctx = _ctx(request)
        name = body.get("model")
        spec = ctx.registry.lookup(name) if isinstance(name, str) else None
        if spec is None or spec.is_remote:
            raise ModelNotFound(str(name), [m.name for m in ctx.registry.models if not m.is_remote])
        if spec.broken:
            raise BadRequest(f"`{spec.name}` cannot be loaded on this host: {spec.broken}", param="model")
        # Where the other ranks reach this one: the address the daemon used to reach us.
        host_ip = socket.gethostbyname(request.url.hostname or "127.0.0.1")
        memory = ctx.manager.snapshot()
        return ctx.hosting.reserve(spec.path, body, host_ip, model_bytes=spec.charge_bytes,
                                   free_bytes=memory.budget - memory.committed)

    @api.post("/{rank_id}/start")
    async def start(rank_id: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        hosts = body.get("hosts")
        if not isinstance(hosts, list) or not all(isinstance(h, list) and h for h in hosts):
            raise BadRequest("`hosts` is one list of addresses per rank", param="hosts")
        return await _ctx(request).hosting.start(rank_id, hosts, str(body.get("coordinator") or ""),
                                                 body.get("devices"))

    @api.get("/{rank_id}/events")
    async def events(rank_id: str, request: Request) -> StreamingResponse:
        stream = _ctx(request).hosting.events(rank_id)
        return StreamingResponse(stream, media_type="application/x-ndjson")

    @api.post("/{rank_id}/commands")
    async def commands(rank_id: str, request: Request) -> dict[str, Any]:
        await _ctx(request).hosting.send(rank_id, await request.body())
        return {"id": rank_id}

    @api.post("/{rank_id}/signal")
    async def send_signal(rank_id: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        _ctx(request).hosting.signal(rank_id, str(body.get("signal", "")))
        return {"id": rank_id}

    @api.delete("/{rank_id}")
    async def end(rank_id: str, request: Request) -> dict[str, Any]:
        """End the rank (or give back an address reserved for one never started)."""
        await _ctx(request).hosting.end(rank_id)
        return {"id": rank_id, "ended": True}

    return api
