"""The voices of a remote speech entry, asked of its backend (its
``/audio/voices?model=``, as mlxd serves it) within a bounded time: a
listing of voices never waits on a backend for long."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from mlxd.errors import BackendTimeout, MlxdError
from mlxd.registry.model import ModelSpec
from mlxd.remote.backends import BackendPool, read_bounded
from mlxd.remote.engine import exchange_error, send
from mlxd.remote.refusals import broken

VOICES_TIMEOUT_S = 5.0
# A voice list is names: a megabyte is thousands of them.
MAX_VOICES_BYTES = 1 << 20


async def backend_voices(pool: BackendPool, spec: ModelSpec) -> list[str]:
    """The voices ``spec``'s backend lists for its model, or the typed error."""
    assert spec.backend is not None
    link = pool.link(spec.backend)
    wait = min(VOICES_TIMEOUT_S, link.spec.first_byte_timeout_s)
    try:
        async with asyncio.timeout(wait):
            response = await send(link, pool.environ, "GET", "/audio/voices",
                                  params={"model": spec.remote_model or spec.name})
            try:
                body, cut = await read_bounded(response, MAX_VOICES_BYTES)
            finally:
                response.release()
    except (aiohttp.ClientError, TimeoutError, MlxdError) as exc:
        if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError):  # not a connect timeout
            raise BackendTimeout(f"No voice list from backend `{link.spec.name}` within {wait:g} s") from None
        raise exchange_error(exc, link.spec) from None
    if cut:
        raise broken(link.spec.name, f"sent a voice list larger than {MAX_VOICES_BYTES >> 20} MiB")
    return read_voices(body, link.spec.name)


def read_voices(body: bytes, backend: str) -> list[str]:
    """Pure: the voice names of an answer shaped as ``/v1/audio/voices``'."""
    try:
        data = json.loads(body)["data"]
        names = [v["id"] for v in data]
    except (ValueError, TypeError, KeyError):
        raise broken(backend, "sent a voice list that could not be read") from None
    if not all(isinstance(name, str) for name in names):
        raise broken(backend, "sent a voice list that could not be read")
    return names
