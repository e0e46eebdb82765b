"""The one thread that runs every MLX call in the process.

MLX streams are bound to the thread that created them ("There is no Stream in
current thread"), and a CPU machine gains nothing from running two models'
kernels at once. So all MLX work — loads, unloads and every decode step — runs
on a single daemon thread, and the asyncio side only ever awaits results.

Scheduling is a ring of generators stepped one step each in turn, so
concurrent generations interleave token by token. Pending one-shot calls run
between any two steps, so a load or an unload never waits for a whole
generation. The hot path per token is: pop a stream off the ring, one
``next()``, an append to the stream's items and, unless one is on its way
already, one ``loop.call_soon_threadsafe`` to wake the consumer.

A generator may yield :data:`SKIP` to give up its turn without producing an
item (e.g. a token whose text is still held back); the worker delivers nothing
for it but still moves on to the next stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from mlxd.engine.generation_pace import GenerationPace
from mlxd.errors import ShuttingDown
from mlxd.thread_names import name_this_thread

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Skip:
    __slots__ = ()

    def __repr__(self) -> str:
        return "SKIP"


# Yielded by a stepped generator to end its turn without delivering anything.
SKIP: Any = _Skip()


class _End:
    __slots__ = ()


_END = _End()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Cancel:
    """Inbox notice: close this channel's generator at the next drain, between steps."""

    __slots__ = ("channel",)

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel


class _Call:
    """A one-shot function call whose outcome goes back to one asyncio future."""

    __slots__ = ("fn", "args", "kwargs", "future", "loop")

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        future: asyncio.Future[Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.future = future
        self.loop = loop

    def run(self) -> None:
        # Cancelled before it started: skip it. Once started it runs to the end
        # and its result is dropped if nobody waits for it any more.
        if self.future.cancelled():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - delivered to the awaiting task
            self._post(_settle_exception, exc)
        else:
            self._post(_settle_result, result)

    def fail(self, exc: BaseException) -> None:
        self._post(_settle_exception, exc)

    def _post(self, settle: Callable[[asyncio.Future[Any], Any], None], value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(settle, self.future, value)
        except RuntimeError:
            log.debug("event loop closed before a worker call result could be delivered")


def _settle_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _settle_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class _Channel:
    """The state one stream shares between the worker thread and the event loop.

    ``step`` and ``abandon`` run only on the worker thread; ``wake`` only on
    the event loop. The worker appends items to ``items`` itself (a deque:
    appends and pops are atomic) and asks the loop to ``wake`` the consumer
    only when no wake-up is on its way already, so tokens that pile up while
    the loop is busy cost one hand-off between them, not one each, and none
    waits longer than it did. The worker's ring holds
    channels, never the consumer's ``WorkerStream``, so a consumer that drops
    its iterator lets it be collected (and cancelled) at once.
    """

    __slots__ = ("make_iter", "iter", "loop", "items", "waiter", "cancelled", "scheduled", "once")

    def __init__(self, make_iter: Callable[[], Iterator[Any]], loop: asyncio.AbstractEventLoop,
                 once: bool = False):
        self.make_iter: Callable[[], Iterator[Any]] | None = make_iter
        # A one-item stream (``MlxWorker.turn``): its item and its end go
        # back together, and it leaves the ring in the same step.
        self.once = once
        self.iter: Iterator[Any] | None = None
        self.loop = loop
        self.items: collections.deque[Any] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        # Written by the consumer, read by the worker: a plain bool is enough.
        self.cancelled = False
        # Set by the worker when it asks for a wake-up, cleared by the wake-up
        # before it looks at the items, so an item is never left unannounced.
        self.scheduled = False

    # ----------------------------------------------------------- worker side
    def step(self) -> bool:
        """Advance the generator by one item. Returns whether to keep it in the ring."""
        if self.cancelled:
            self.close_iter()
            return False
        try:
            it = self.iter
            if it is None:
                assert self.make_iter is not None
                it = self.iter = iter(self.make_iter())
                self.make_iter = None
            item = next(it)
        except StopIteration:
            self.iter = None
            self.post(_END)
            return False
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self.iter = None
            self.post(_Failure(exc))
            return False
        if item is SKIP:
            return True
        if self.once:
            self.close_iter()
            self.items.append(item)
            self.post(_END)
            return False
        return self.post(item)

    def abandon(self, exc: BaseException) -> None:
        """Stop without finishing (worker shutdown): close and tell the consumer why."""
        self.close_iter()
        self.post(_Failure(exc))

    def close_iter(self) -> None:
        it, self.iter, self.make_iter = self.iter, None, None
        close = getattr(it, "close", None)
        if close is None:
            return
        try:
            close()
        except Exception:  # noqa: BLE001 - a failing cleanup must not kill the worker
            log.exception("closing a cancelled worker stream failed")

    def post(self, item: Any) -> bool:
        self.items.append(item)
        if self.scheduled and not self.loop.is_closed():
            return True  # the wake-up on its way finds this item too
        self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self.wake)
        except RuntimeError:
            # The consumer's event loop is closed (with or without a wake-up
            # left pending): nobody will read this stream.
            self.cancelled = True
            self.close_iter()
            return False
        return True

    # ------------------------------------------------------------ loop side
    def wake(self) -> None:
        self.scheduled = False
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class WorkerStream(Generic[T]):
    """The consumer's async iterator over what a generator yields on the worker.

    Closing it (``aclose``), cancelling the task awaiting it, or simply
    dropping it sets a flag the worker checks before the generator's next
    step; the worker then closes the generator on its own thread.
    """

    def __init__(self, worker: MlxWorker, channel: _Channel) -> None:
        self._worker = worker
        self._channel = channel
        self._finished = False

    def __aiter__(self) -> WorkerStream[T]:
        return self

    async def __anext__(self) -> T:
        channel = self._channel
        items = channel.items
        while not items:
            if self._finished:
                raise StopAsyncIteration
            waiter = channel.waiter = channel.loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.cancel()
                raise
            finally:
                channel.waiter = None
        item = items.popleft()
        if item is _END:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.exc
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        """Ask the worker to close the generator before its next step.

        The close is queued like a call, so once any later ``worker.call``
        has returned, the generator is closed.
        """
        if not self._finished:
            self._finished = True
            self._channel.items.clear()
            self._worker._cancel(self._channel)

    async def aclose(self) -> None:
        self.cancel()

    def __del__(self) -> None:
        # A consumer that breaks out of ``async for`` and drops the iterator
        # must still stop generation.
        if not getattr(self, "_finished", True):
            self._worker._cancel(self._channel)


class MlxWorker:
    """Runs every MLX call on one daemon thread; see the module docstring."""

    def __init__(self, name: str = "mlx-worker") -> None:
        self._name = name
        # Appends from any thread; only the worker pops. deque ops are atomic.
        self._inbox: collections.deque[_Call | _Cancel | _Channel] = collections.deque()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = threading.Event()
        # Counters the worker thread writes and anyone may read.
        self.steps = 0
        self.calls = 0
        self.active_streams = 0
        # Streams in the ring that step more than once (a decode loop, a
        # synthesis), one-shot turns left out: whether anything is decoding.
        # Kept as channels enter and leave the ring, not counted each step.
        self.open_streams = 0
        # ``side_stream``'s MLX stream, made once on this thread.
        self._side_stream: Any = None
        # What decoding on this device keeps of its pace beside encoder
        # passes: batch loops report their steps, encoders ask when to pass.
        self.pace = GenerationPace()

    def side_stream(self) -> Any:
        """Worker thread only: an MLX stream beside mlx-lm's generation
        stream, for work that must not queue behind a model's step computed
        ahead (a prompt's prefill, engine/batch.py). One per worker, not one
        per engine: MLX never frees a stream (on Metal each is a command
        queue), and a daemon loads and unloads engines for as long as it
        runs."""
        import mlx.core as mx

        if self._side_stream is None:
            self._side_stream = mx.new_stream(mx.default_device())
        return self._side_stream

    # ------------------------------------------------------------- lifecycle
    def start(self) -> MlxWorker:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stopped.is_set()

    async def shutdown(self) -> None:
        """Run the calls already queued, end open streams with ``ShuttingDown``, join."""
        if self._thread is None:
            self._stopping = True
            return
        self._stopping = True
        self._wake()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._thread.join)

    # ------------------------------------------------------------ submitting
    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once on the worker and return its result.

        If the awaiting task is cancelled before the call starts, it is
        skipped; once started it runs to completion (its result is dropped).
        """
        self._ensure_accepting()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._inbox.append(_Call(fn, args, kwargs, future, loop))
        self._wake()
        if self._stopped.is_set() and self._inbox:
            # Lost a race with the worker exiting: nobody will run this.
            self._fail_inbox()
        return await future

    def stream(self, make_iter: Callable[[], Iterator[T]]) -> WorkerStream[T]:
        """Step ``make_iter()`` on the worker, one item per turn, as an async iterator.

        ``make_iter`` itself is called on the worker at the first step, so the
        generator may do MLX work from its very first line.
        """
        return self._open(make_iter)

    def _open(self, make_iter: Callable[[], Iterator[T]], once: bool = False) -> WorkerStream[T]:
        self._ensure_accepting()
        channel = _Channel(make_iter, asyncio.get_running_loop(), once)
        self._inbox.append(channel)
        self._wake()
        if self._stopped.is_set() and self._inbox:
            self._fail_inbox()
        return WorkerStream(self, channel)

    async def turn(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the worker as one turn in the ring, as a stream's step
        (after the streams ahead of it, not between two steps as ``call``):
        its result comes back in one hand-off and nothing is left to close."""
        stream: WorkerStream[T] = self._open(lambda: iter((fn(),)), once=True)
        try:
            result = await stream.__anext__()
        except StopAsyncIteration:
            raise ShuttingDown("The model worker is shutting down.") from None
        with contextlib.suppress(StopAsyncIteration):
            await stream.__anext__()  # its end, delivered with it: no wait
        return result

    def _ensure_accepting(self) -> None:
        if self._stopping:
            raise ShuttingDown("The model worker is shutting down.")
        if self._thread is None:
            raise RuntimeError("MlxWorker.start() was not called")

    def _wake(self) -> None:
        self._wakeup.set()

    def _cancel(self, channel: _Channel) -> None:
        channel.cancelled = True
        self._inbox.append(_Cancel(channel))
        self._wakeup.set()

    # ----------------------------------------------------------- the thread
    def _run(self) -> None:
        name_this_thread()
        inbox = self._inbox
        ring: collections.deque[_Channel] = collections.deque()
        wakeup = self._wakeup
        try:
            while True:
                while inbox:
                    job = inbox.popleft()
                    if isinstance(job, _Call):
                        self.calls += 1
                        job.run()
                    elif isinstance(job, _Cancel):
                        job.channel.close_iter()
                        if job.channel in ring:
                            ring.remove(job.channel)
                            self.open_streams -= not job.channel.once
                        self.active_streams = len(ring)
                    else:
                        ring.append(job)
                        self.open_streams += not job.once
                    # Not held while idle: a call's function may be an
                    # engine's bound method (its release), and that engine
                    # must be collectable once unloaded.
                    job = None
                if self._stopping:
                    break
                if ring:
                    channel = ring.popleft()
                    self.steps += 1
                    if channel.step():
                        ring.append(channel)
                    else:
                        self.open_streams -= not channel.once
                    channel = None
                    self.active_streams = len(ring)
                    continue
                self.active_streams = self.open_streams = 0
                wakeup.clear()
                if not inbox and not self._stopping:
                    wakeup.wait()
        finally:
            for channel in ring:
                channel.abandon(ShuttingDown("The model worker shut down."))
            self.active_streams = self.open_streams = 0
            self._stopped.set()
            self._fail_inbox()

    def _fail_inbox(self) -> None:
        while self._inbox:
            try:
                job = self._inbox.popleft()
            except IndexError:
                return
            exc = ShuttingDown("The model worker shut down.")
            if isinstance(job, _Call):
                job.fail(exc)
            elif isinstance(job, _Cancel):
                job.channel.close_iter()
            else:
                job.abandon(exc)
