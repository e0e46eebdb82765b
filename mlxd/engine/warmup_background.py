"""A warm-up that runs after the engine is handed over, while it is idle.

Used when a model's kernels are not known to be compiled on this machine
(``mlxd.engine.warmup.decide_mode``): compiling the whole plan before the
first request would make that request wait for kernels it mostly does not
need. The engine serves at once; the plan runs behind it:

- never ahead of a user request: it starts ``START_DELAY_S`` after the
  hand-over (the request that caused the load reaches the engine a few
  event-loop turns after it) and each run waits until no user request is in
  flight; a user request that arrives meanwhile pushes the run aside within
  one step (``EngineBase._arrived``) and the run is repeated later;
- leaving no trace: its requests neither read nor fill the prefix cache and
  are not counted (``GenerationRequest.warmup``);
- cancelled by the engine's close (an unload), before the model goes.

Until it is done the engine's ``warmup`` report says ``done: false``; the
prefix cache's restore-or-recompute decision has no measured prefill speed
until then and restores (``mlxd.engine.restore_policy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mlxd.engine.warmup import BACKGROUND, WarmupReport, WarmupRun, warm_up

log = logging.getLogger(__name__)

START_DELAY_S = 1.0


class BackgroundWarmup:
    def __init__(
        self,
        engine: Any,
        runs: Sequence[WarmupRun],
        *,
        max_chars: int,
        on_done: Callable[[WarmupReport], Awaitable[None]] | None = None,
        start_delay_s: float = START_DELAY_S,
    ) -> None:
        self._engine = engine
        self._runs = tuple(runs)
        self._max_chars = max_chars
        self._on_done = on_done
        self._delay = start_delay_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Event loop: begin (the engine's report says it is pending)."""
        self._engine.warmup = WarmupReport(0.0, 0, None, mode=BACKGROUND, done=False)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        engine = self._engine
        await asyncio.sleep(self._delay)
        report = await warm_up(engine, self._runs, max_chars=self._max_chars, mode=BACKGROUND)
        engine.warmup = report
        log.info("%s warmed up in the background in %.2fs (%d requests, %d pushed aside by users, prefill %s tok/s)",
                 engine.name, report.seconds, report.requests, report.preempted, report.prefill_tokens_per_s)
        if self._on_done is not None:
            await self._on_done(report)

    async def wait(self) -> None:
        """Until it has finished (tests, benchmarks)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def cancel(self) -> None:
        """Stop it and wait until its requests have let go of the model."""
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
