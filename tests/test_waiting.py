"""A background loop cancelled in the loop turn that wakes it must end.

On Python 3.11 ``asyncio.wait_for`` loses that cancellation; the residency
timer then waited forever and every daemon shutdown in the tests took the
60 s of its thread join."""

import asyncio

from mlxd.waiting import event_set_within


def _loop_until_cancelled(event: asyncio.Event, rounds: list[int]):
    async def loop() -> None:
        while True:
            await event_set_within(event, 30.0)
            event.clear()
            rounds.append(1)
    return loop()


def test_a_cancel_that_arrives_with_the_wake_up_ends_the_loop():
    async def main() -> None:
        event, rounds = asyncio.Event(), []
        task = asyncio.create_task(_loop_until_cancelled(event, rounds))
        await asyncio.sleep(0.01)
        event.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done == {task} and task.cancelled()

    asyncio.run(main())


def test_it_says_whether_the_event_came_in_time():
    async def main() -> tuple[bool, bool, bool]:
        event = asyncio.Event()
        late = await event_set_within(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        in_time = await event_set_within(event, 5)
        unlimited = await event_set_within(event, None)
        return late, in_time, unlimited

    assert asyncio.run(main()) == (False, True, True)
