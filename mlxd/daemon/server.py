"""Running the daemon: uvicorn with mlxd's own signal handling.

SIGTERM or SIGINT starts a drain: new requests get 503, in-flight requests and
streams finish up to ``shutdown_grace_seconds``, what remains is aborted with a
proper final chunk, every model's cache is saved and the model unloaded, and
the process exits 0. An answer still being written when the grace is over
(and the drain's aborts have had a moment to send their final chunks) has a
client that is not reading it: its connection is closed then, rather than
held for uvicorn's own graceful-shutdown wait. A second signal forces a fast exit (cache files are
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

# After the drain, how long the streams it aborted get to write their final
# chunks to clients that read them (milliseconds on loopback), even when the
# grace is already over.
FINAL_CHUNK_SECONDS = 0.5


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
        loop = asyncio.get_running_loop()
        grace = self.ctx.settings.server.shutdown_grace_seconds
        deadline = loop.time() + grace
        try:
            await self.ctx.manager.shutdown(grace)
            await self._close_unread_answers(max(deadline, loop.time() + FINAL_CHUNK_SECONDS))
        except Exception:
            log.exception("drain failed")
        finally:
            self.should_exit = True

    async def _close_unread_answers(self, until: float) -> None:
        """Answers still being written may finish until ``until``; the
        connections of those that have not are closed (their requests end
        as 499s)."""
        loop = asyncio.get_running_loop()

        def unfinished() -> list:
            # Every connection is build_server's bounded protocol.
            return [c for c in self.server_state.connections if c.answering()]  # type: ignore[union-attr]

        while unfinished() and loop.time() < until:
            await asyncio.sleep(0.05)
        stuck = unfinished()
        for connection in stuck:
            self.ctx.metrics.connections_closed.labels("shutdown").inc()
            connection.cut()
        if stuck:
            log.warning("shutdown: closed %d connection(s) whose client read none of the rest of its answer "
                        "within the grace", len(stuck))


def build_server(app: ASGIApp, ctx: DaemonContext, on_reload: Callable[[], Awaitable[object]] | None) -> DaemonServer:
    """uvicorn around ``app``; ``on_reload`` is what SIGHUP calls (None: ignored)."""
    server = ctx.settings.server
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_config=None,
        access_log=False,
        # Generous: our own drain has already let streams finish and closed
        # the connections of clients that were not reading.
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
        http=bounded_protocol(server.max_connections, server.header_timeout_s,
                              lambda: ctx.settings.server.send_timeout_s,
                              lambda reason: ctx.metrics.connections_closed.labels(reason).inc()),
    )
    return DaemonServer(config, ctx, on_reload=on_reload)
