"""Running the daemon: uvicorn with mlxd's own signal handling.

SIGTERM or SIGINT starts a drain: new requests get 503, in-flight requests and
streams finish up to ``shutdown_grace_seconds``, what remains is aborted with a
proper final chunk, every model's cache is saved and the model unloaded, and
the process exits 0. A second signal forces a fast exit (cache files are
written atomically, so even that leaves nothing corrupt). SIGHUP reloads the
registry.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from mlxd.api.context import DaemonContext
from mlxd.daemon.connections import bounded_protocol

log = logging.getLogger("mlxd")


class DaemonServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        ctx: DaemonContext,
        on_reload: Callable[[], Awaitable[object]] | None,
    ) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.on_reload = on_reload
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        if self.on_reload is not None:
            try:
                self._loop.add_signal_handler(signal.SIGHUP, self._reload_requested)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        await super().startup(sockets=sockets)

    def _reload_requested(self) -> None:
        if self.on_reload is not None:
            asyncio.ensure_future(self.on_reload())

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not calling super(): uvicorn would re-raise the signal after
        # shutting down, and the process must exit 0 after a clean drain.
        # ctx.draining, not the drain task: the task starts on the loop's next
        # turn, and a second signal that came before it (a loaded machine)
        # started a second drain instead of the fast exit.
        if self.ctx.draining or self._loop is None:
            log.warning("second signal: exiting now")
            self.force_exit = True
            self.should_exit = True
            return
        # Set before anything else runs: a second signal's handler can run in
        # the middle of this one (between any two bytecodes, the log write
        # here included), and it must find the drain begun.
        self.ctx.draining = True
        log.info("signal %s: draining (grace %.0f s)", signal.Signals(sig).name,
                 self.ctx.settings.server.shutdown_grace_seconds)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.ensure_future(self._drain_and_exit())

    async def _drain_and_exit(self) -> None:
        try:
            await self.ctx.manager.shutdown(self.ctx.settings.server.shutdown_grace_seconds)
        except Exception:
            log.exception("drain failed")
        finally:
            self.should_exit = True


def build_server(app: ASGIApp, ctx: DaemonContext, on_reload: Callable[[], Awaitable[object]] | None) -> DaemonServer:
    """uvicorn around ``app``; ``on_reload`` is what SIGHUP calls (None: ignored)."""
    server = ctx.settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_config=None,
        access_log=False,
        # Generous: our own drain has already let streams finish.
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
        http=bounded_protocol(server.max_connections, server.header_timeout_s,
                              lambda: ctx.settings.server.send_timeout_s),
    )
    return DaemonServer(config, ctx, on_reload=on_reload)
