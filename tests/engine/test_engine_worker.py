"""The MLX worker: one thread, round-robin streams, calls between steps, cancellation."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator

import pytest
from engine.engine_support import run

from mlxd.engine.worker import SKIP, MlxWorker
from mlxd.errors import ShuttingDown


def counting(name: str, n: int, log: list[tuple[str, int]]) -> Iterator[int]:
    for i in range(n):
        log.append((name, i))
        yield i


class Closable:
    """A generator wrapper that records whether, and on which thread, it was closed."""

    def __init__(self) -> None:
        self.produced = 0
        self.closed_on: str | None = None

    def items(self) -> Iterator[int]:
        try:
            while True:
                self.produced += 1
                yield self.produced
        finally:
            self.closed_on = threading.current_thread().name


async def drain(stream):
    return [item async for item in stream]


async def sync_with(worker: MlxWorker) -> None:
    """Returns once the worker has handled everything queued before it (cancels too)."""
    await worker.call(lambda: None)


def test_call_runs_on_the_worker_thread_and_returns_its_result(worker):
    async def main():
        return await worker.call(lambda a, b=0: (threading.current_thread().name, a + b), 2, b=3)

    assert run(main()) == ("mlx-worker", 5)


def test_call_exception_propagates_to_the_awaiting_task(worker):
    def boom():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        run(worker.call(boom))


def test_stream_exception_propagates_after_the_items_before_it(worker):
    def failing():
        yield 1
        yield 2
        raise KeyError("lost")

    async def main():
        got = []
        with pytest.raises(KeyError, match="lost"):
            async for item in worker.stream(failing):
                got.append(item)
        return got

    assert run(main()) == [1, 2]


def test_mlx_runs_on_the_worker():
    import mlx.core as mx

    worker = MlxWorker().start()

    async def main():
        return await worker.call(lambda: (mx.arange(10) * 2).sum().item())

    try:
        assert run(main()) == 90
    finally:
        run(worker.shutdown())


def test_the_side_stream_is_made_once_per_worker_and_computes_there():
    """MLX never frees a stream, so engines that come and go (a model
    loaded and unloaded for weeks) must share the worker's one."""
    import mlx.core as mx

    worker = MlxWorker().start()

    def on_the_side():
        side = worker.side_stream()
        with mx.stream(side):
            total = (mx.arange(10) * 2).sum()
        return side, total.item()

    try:
        first, total = run(worker.call(on_the_side))
        again, _ = run(worker.call(on_the_side))
        assert total == 90
        assert again == first
        assert first != mx.default_stream(mx.default_device())
    finally:
        run(worker.shutdown())


def test_streams_are_stepped_round_robin_one_step_each(worker):
    go = threading.Event()
    log: list[str] = []

    def steps(name: str) -> Iterator[int]:
        while not go.is_set():  # both streams are in the ring before either counts
            yield SKIP
        for i in range(50):
            log.append(name)
            yield i

    async def main():
        a = worker.stream(lambda: steps("a"))
        b = worker.stream(lambda: steps("b"))
        go.set()
        return await asyncio.gather(drain(a), drain(b))

    assert run(main()) == [list(range(50)), list(range(50))]
    assert len(log) == 100
    assert all(x != y for x, y in zip(log, log[1:])), "a stream took two turns in a row"


def test_a_call_runs_between_steps_of_an_endless_stream(worker):
    source = Closable()

    async def main():
        stream = worker.stream(source.items)
        await stream.__anext__()
        # Only possible if the call is not queued behind the (endless) stream.
        result = await worker.call(lambda: "loaded")
        produced_at_call = source.produced
        await stream.aclose()
        await sync_with(worker)
        return result, produced_at_call

    result, produced_at_call = run(main())
    assert result == "loaded"
    assert source.closed_on is not None
    assert produced_at_call >= 1


def test_a_turn_runs_once_in_the_ring_between_a_streams_steps_and_leaves_it(worker):
    log: list[str] = []
    turned = threading.Event()

    def steps() -> Iterator[int]:
        # Endless until the turn has run, then three steps more.
        i = 0
        while not turned.is_set() or log[-3:] != ["stream"] * 3:
            log.append("stream")
            yield i
            i += 1

    def forward() -> str:
        log.append("turn")
        turned.set()
        return threading.current_thread().name

    async def main():
        stream = worker.stream(steps)
        await stream.__anext__()
        turned_on = await worker.turn(forward)
        await drain(stream)
        await sync_with(worker)
        return turned_on

    assert run(main()) == "mlx-worker"
    assert log.count("turn") == 1
    i = log.index("turn")
    assert log[i - 1] == log[i + 1] == "stream", log
    assert worker.active_streams == 0


def test_a_turn_that_raises_raises_in_the_awaiting_task(worker):
    def boom() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        run(worker.turn(boom))
    assert run(worker.turn(lambda: 7)) == 7


def test_every_item_arrives_once_and_in_order(worker):
    async def main():
        return [i async for i in worker.stream(lambda: iter(range(20_000)))]

    assert run(main()) == list(range(20_000))


def test_items_made_while_the_event_loop_is_busy_all_arrive_in_order(worker):
    # The loop blocks while the worker keeps producing: the items pile up
    # behind one wake-up and must still come out whole and in order.
    import time

    def slow_start():
        yield "first"
        for i in range(500):
            yield i

    async def main():
        got = []
        async for item in worker.stream(slow_start):
            if item == "first":
                time.sleep(0.2)  # a busy event loop, not an await
            got.append(item)
        return got

    assert run(main()) == ["first", *range(500)]


def test_a_stream_whose_event_loop_closed_stops_on_the_worker(worker):
    # The loop goes away with items (and a wake-up) still on their way: the
    # worker must not step an endless generator for nobody.
    import time

    source = Closable()  # endless
    loop = asyncio.new_event_loop()

    async def start():
        stream = worker.stream(source.items)
        await stream.__anext__()
        return stream

    stream = loop.run_until_complete(start())
    time.sleep(0.1)  # stopped, not closed: a wake-up is scheduled that will never run
    loop.close()
    deadline = time.monotonic() + 5
    while source.closed_on is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert source.closed_on == "mlx-worker"
    del stream


def test_skip_gives_up_a_turn_without_delivering(worker):
    def sparse():
        for i in range(10):
            yield i if i % 3 == 0 else SKIP

    async def main():
        return [i async for i in worker.stream(sparse)]

    assert run(main()) == [0, 3, 6, 9]


def test_aclose_closes_the_generator_on_the_worker_and_stepping_stops(worker):
    source = Closable()

    async def main():
        stream = worker.stream(source.items)
        async for item in stream:
            if item == 3:
                break
        await stream.aclose()
        await sync_with(worker)
        steps = worker.steps
        produced = source.produced
        await sync_with(worker)
        return steps, produced

    steps, produced = run(main())
    assert source.closed_on == "mlx-worker"
    assert worker.steps == steps
    assert source.produced == produced
    assert worker.active_streams == 0


def test_dropping_the_iterator_without_closing_it_stops_generation(worker):
    source = Closable()

    async def main():
        stream = worker.stream(source.items)
        await stream.__anext__()
        del stream
        gc.collect()
        await sync_with(worker)

    run(main())
    assert source.closed_on == "mlx-worker"


def test_cancelling_the_consuming_task_stops_generation(worker):
    source = Closable()
    gate = threading.Event()

    def gated():
        for item in source.items():
            yield item
            gate.wait()  # the worker is busy while the consumer gets cancelled

    async def main():
        got_first = asyncio.Event()

        async def consume():
            async for _ in worker.stream(gated):
                got_first.set()

        task = asyncio.create_task(consume())
        await got_first.wait()
        await asyncio.sleep(0)  # the consumer now awaits the second item
        task.cancel()
        await asyncio.sleep(0)  # the task handles its cancellation: the stream is cancelled
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sync_with(worker)

    run(main())
    assert source.closed_on == "mlx-worker"
    # At most the item the worker was already making when the task was cancelled.
    assert source.produced <= 2


def test_waiting_on_the_worker_never_blocks_the_event_loop(worker):
    release = threading.Event()

    async def main():
        busy = asyncio.create_task(worker.call(release.wait))
        ticks = 0
        # The loop keeps running other work while the worker is stuck.
        while ticks < 100:
            await asyncio.sleep(0)
            ticks += 1
        assert not busy.done()
        release.set()
        return await busy

    assert run(main()) is True


def test_shutdown_runs_queued_calls_and_ends_open_streams():
    worker = MlxWorker().start()
    ran: list[str] = []
    gate = threading.Event()

    async def main():
        stream = worker.stream(lambda: iter(lambda: 1, None))  # endless
        await stream.__anext__()
        blocker = asyncio.create_task(worker.call(gate.wait))
        queued = asyncio.create_task(worker.call(ran.append, "unload"))
        await asyncio.sleep(0)
        shutdown = asyncio.create_task(worker.shutdown())
        await asyncio.sleep(0)
        gate.set()
        await shutdown
        await blocker
        await queued
        with pytest.raises(ShuttingDown):
            async for _ in stream:
                pass
        with pytest.raises(ShuttingDown):
            await worker.call(ran.append, "late")

    run(main())
    assert ran == ["unload"]
    assert not worker.running


def test_open_streams_counts_streams_that_decode_not_one_shot_turns(worker):
    """What an encoder asks before it lets its pass run beside other work
    (engine/embedding.py): a stream stepping in the ring counts, a turn
    (one item, then gone) does not, and a closed stream stops counting."""
    seen: list[int] = []

    def decoding() -> Iterator[object]:
        while True:
            yield SKIP

    async def go() -> None:
        seen.append(await worker.turn(lambda: worker.open_streams))  # a turn alone: nothing decodes
        stream = worker.stream(decoding)
        await asyncio.sleep(0.02)
        seen.append(await worker.turn(lambda: worker.open_streams))
        await stream.aclose()
        await worker.call(lambda: None)  # the close is queued ahead of it: done once it returns
        seen.append(worker.open_streams)

    run(go())
    assert seen == [0, 1, 0]
