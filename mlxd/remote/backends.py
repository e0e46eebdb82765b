"""The daemon's remote backends: their current settings, one HTTP client
shared by all of them, what each has done (in flight, errors, latency) and
a background poll that keeps "is it reachable" fresh for status.

The client is aiohttp rather than the httpx the rest of mlxd uses: a relay
reads one small event per token, and on aiohttp (a C parser straight on
asyncio) that read costs about half of what it does through httpx's
httpcore, h11 and anyio layers (bench/relay_read.py).

Built once by ``build_daemon``; a hot reload hands it the new backends. A
request takes the backend's settings when it starts (``link``), so an edit
applies to the requests after it and the ones in flight finish unchanged.
"""

from __future__ import annotations

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import certifi

from mlxd.errors import describe_exception
from mlxd.registry.model import BackendSpec, Registry, is_pattern
from mlxd.waiting import event_set_within

if TYPE_CHECKING:
    # Imported where a session is made: a daemon with no backends never loads
    # aiohttp (half a second of its start on a quiet 2-core machine).
    import aiohttp

log = logging.getLogger("mlxd.remote")

# A backend's /v1/status or model list; a larger one is cut (and then not
# JSON: its model states are unknown).
MAX_STATUS_BYTES = 8 * 1024 * 1024


@dataclass
class BackendStats:
    """What one backend has done, for status and metrics (the event loop
    alone writes these)."""

    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    # From the background poll (None: not polled yet).
    reachable: bool | None = None
    latency_ms: float | None = None
    polled_at: float | None = None
    poll_error: str | None = None
    # kind: mlxd: the backend's own models and their states, from its /v1/status.
    models: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendLink:
    """One request's view of its backend: the settings it started with."""

    spec: BackendSpec
    stats: BackendStats
    client: aiohttp.ClientSession

    def headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        key = environ.get(self.spec.api_key_env) if self.spec.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def timeout(self) -> aiohttp.ClientTimeout:
        # Reads are bounded by first_byte / idle in the engine, which know
        # which phase of the answer the stream is in.
        import aiohttp

        return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=self.spec.connect_timeout_s, sock_read=None)


@dataclass(frozen=True)
class BackendView:
    """A backend as status shows it: its settings and a copy of its figures,
    safe to keep."""

    spec: BackendSpec
    stats: BackendStats


class BackendPool:
    def __init__(self, backends: tuple[BackendSpec, ...], *, environ: Mapping[str, str] | None = None) -> None:
        self._specs = {b.name: b for b in backends}
        self._stats: dict[str, BackendStats] = {b.name: BackendStats() for b in backends}
        self.environ = os.environ if environ is None else environ
        # No pool limit: each backend's max_concurrency bounds its requests
        # in the residency queue already.
        self._client: aiohttp.ClientSession | None = None
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop it will run on. The proxy
        # settings of the environment are not the backends' business.
        if self._client is None:
            import aiohttp

            # Certificates checked against certifi's roots, as httpx did: a
            # Python from python.org on macOS has no system roots to offer.
            tls = ssl.create_default_context(cafile=certifi.where())
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ssl=tls)
            self._client = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._client

    def names(self) -> list[str]:
        return list(self._specs)

    def link(self, name: str) -> BackendLink:
        return BackendLink(self._specs[name], self._stats[name], self.client)

    def follow(self, registry: Registry) -> None:
        """After a reload (``DaemonContext.follow``): the registry's backends."""
        self.reconfigure(registry.backends)

    def reconfigure(self, backends: tuple[BackendSpec, ...]) -> None:
        self._specs = {b.name: b for b in backends}
        for name in self._specs:
            self._stats.setdefault(name, BackendStats())
        # Figures of a backend that is gone go with it; in-flight requests
        # keep their own reference until they finish.
        for name in [n for n in self._stats if n not in self._specs]:
            del self._stats[name]
        self._wake.set()  # poll the new settings now, not at the old interval

    def failed(self, name: str, error: BaseException) -> None:
        stats = self._stats.get(name)
        if stats is not None:
            stats.errors += 1
            stats.last_error = describe_exception(error)
            stats.last_error_at = time.time()

    def current(self, name: str) -> BackendView | None:
        """A backend's settings and its live figures (not a copy: read them
        at once), or None for a name that is gone."""
        spec = self._specs.get(name)
        return BackendView(spec, self._stats[name]) if spec is not None else None

    def views(self) -> tuple[BackendView, ...]:
        return tuple(
            BackendView(spec, replace(self._stats[name], models=dict(self._stats[name].models)))
            for name, spec in self._specs.items()
        )

    # --- the background poll ---------------------------------------------------

    async def start(self) -> None:
        if self._specs and self._poller is None:
            self._poller = asyncio.create_task(self._poll_loop(), name="mlxd-backend-poll")

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def poll_all(self) -> None:
        """Ask every backend how it is, at once (one slow backend does not
        hold up the others' figures)."""
        await asyncio.gather(*(self._poll(self.link(n)) for n in list(self._specs)))

    async def _poll_loop(self) -> None:
        """Each backend at its own ``poll_interval_s``; all of them at once
        after a reconfigure (their settings may have changed)."""
        loop = asyncio.get_running_loop()
        due: dict[str, float] = {}
        while True:
            self._wake.clear()
            now = loop.time()
            names = [n for n in self._specs if due.get(n, now) <= now]
            try:
                await asyncio.gather(*(self._poll(self.link(n)) for n in names))
            except Exception:  # a bug here must not stop polling for good
                log.exception("polling backends failed")
            due = {n: due.get(n, now) for n in self._specs}
            for name in names:
                if name in self._specs:
                    due[name] = loop.time() + self._specs[name].poll_interval_s
            wait = min(due.values(), default=now + 10.0) - loop.time()
            await event_set_within(self._wake, wait)
            if self._wake.is_set():
                due.clear()

    async def _poll(self, link: BackendLink) -> None:
        import aiohttp

        spec, stats = link.spec, link.stats
        # mlxd says what its models are doing; any OpenAI server lists models.
        path = "/status" if spec.kind == "mlxd" else "/models"
        started = time.perf_counter()
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=spec.connect_timeout_s, sock_read=max(spec.connect_timeout_s, 5.0)
        )
        try:
            async with link.client.get(spec.url + path, headers=link.headers(self.environ), timeout=timeout,
                                       allow_redirects=False) as response:
                status = response.status
                answer, _ = await read_bounded(response, MAX_STATUS_BYTES)
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem: str | None = describe_exception(exc)
        else:
            # Reachable is "it answers": some servers' model lists are broken
            # (mlx_lm.server's fails without a Hugging Face cache), and a 4xx
            # still means requests get there.
            problem = f"HTTP {status} from {path}" if status >= 500 else None
        if problem is not None:
            if stats.reachable is not False:
                log.warning("backend %s (%s) is not reachable: %s", spec.name, spec.url, problem)
            stats.reachable = False
            stats.poll_error = problem
            stats.latency_ms = None
        else:
            if stats.reachable is False:
                log.info("backend %s (%s) is reachable again", spec.name, spec.url)
            stats.reachable = True
            stats.poll_error = f"HTTP {status} from {path}" if status >= 300 else None
            stats.latency_ms = round((time.perf_counter() - started) * 1000, 1)
            stats.models = _model_states(answer) if spec.kind == "mlxd" else {}
        stats.polled_at = time.time()


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of an answer's body (decompressed, if the
    server compressed it), and whether there was more: a backend's answer is
    never read whole on trust."""
    parts: list[bytes] = []
    size = 0
    while True:
        data = await response.content.read(limit + 1 - size)
        if not data:
            return b"".join(parts), False
        parts.append(data)
        size += len(data)
        if size > limit:
            return b"".join(parts)[:limit], True


def _model_states(answer: bytes) -> dict[str, str]:
    """Each model's state by every exact name a client may use for it: its
    own and its aliases (a front's ``remote_model`` may be either)."""
    try:
        status = json.loads(answer)
    except ValueError:
        return {}
    models = status.get("models") if isinstance(status, dict) else None
    states: dict[str, str] = {}
    for model in models or []:
        if not isinstance(model, dict) or "name" not in model:
            continue
        state = str(model.get("state", "unknown"))
        aliases = model.get("aliases") if isinstance(model.get("aliases"), list) else []
        # Glob aliases match many names: they say nothing about one of them.
        for alias in aliases:
            if isinstance(alias, str) and not is_pattern(alias):
                states.setdefault(alias, state)
        states[str(model["name"])] = state  # a name wins over another model's alias
    return states
