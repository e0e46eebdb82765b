"""Preemption before the first byte through the residency shell and the
request path's wrapper (``api/preemptible.py``), on a fake engine whose
first token waits for the test: the bulk generation stops, waits again,
starts over once the interactive lease is given back, and its consumer sees
one answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.residency_sim import manager, spec

from mlxd.api.preemptible import Preemptible, preemptible
from mlxd.caller import Caller
from mlxd.engine.types import GenerationChunk
from mlxd.registry.model import Registry, ServerSpec
from mlxd.residency.shell import ResidencyManager
from support.idle_lifecycle import IdleLifecycle

pytestmark = pytest.mark.anyio
BULK, EDITOR = Caller(app="indexer", priority="bulk"), Caller(app="editor", priority="interactive")


class SlowStart(IdleLifecycle):
    """An engine whose generations accept at once and produce their text
    once ``go`` is set (a prefill that takes a while)."""

    kind, measured_bytes = "fake", None

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.started = 0
        self.stopped = 0

    async def generate(self, request):
        self.started += 1
        try:
            yield GenerationChunk(text="")
            # (A request may bring its own start signal.)
            await (request if isinstance(request, asyncio.Event) else self.go).wait()
            for word in ("one ", "two"):
                yield GenerationChunk(text=word, completion_tokens=1)
            yield GenerationChunk(text="", finish_reason="stop")
        except BaseException:
            self.stopped += 1
            raise

@pytest.fixture
def anyio_backend():
    return "asyncio"


class Holder:
    def __init__(self, lease) -> None:
        self.lease, self.engine = lease, lease.engine


async def bulk_lease(slots: int = 1) -> tuple[SlowStart, ResidencyManager, Holder]:
    """A model of ``slots`` slots on a ``SlowStart`` engine, all of them
    leased by one bulk request (its ``n`` choices)."""
    engine = SlowStart()

    async def factory(s, registry):
        return engine

    registry = Registry(
        Path("/tmp/models.yaml"), "x", manager(8), ServerSpec(), (spec("m", 1, max_concurrency=slots),)
    )
    mgr = ResidencyManager(registry, factory, auto_tick=False)
    return engine, mgr, Holder(await mgr.acquire("m", caller=BULK, slots=slots))


async def test_a_bulk_generation_before_its_first_token_stops_waits_again_and_starts_over():
    engine, mgr, holder = await bulk_lease()

    async def bulk() -> str:
        chunks = preemptible(holder, object(), engine.generate(None), lambda held: mgr.requeue(held))
        try:
            return "".join([c.text async for c in chunks])
        finally:
            holder.lease.release()

    answer = asyncio.create_task(bulk())
    for _ in range(5):
        await asyncio.sleep(0)
    editor = await asyncio.wait_for(mgr.acquire("m", caller=EDITOR), 5)
    assert engine.stopped == 1 and mgr.core.queued("m") == 1, "the bulk generation stopped and waits again"
    engine.go.set()
    editor.release()
    assert await asyncio.wait_for(answer, 5) == "one two"
    assert engine.started == 2
    assert mgr.stats["m"].requests == 2, "a preempted request is still one request"
    assert mgr.core.residents["m"].active == 0 and not mgr.core.holders


async def test_a_bulk_generation_that_has_sent_its_first_token_keeps_its_slot():
    engine, mgr, holder = await bulk_lease()
    engine.go.set()
    chunks = preemptible(holder, object(), engine.generate(None), lambda held: mgr.requeue(held))
    assert (await anext(chunks)).text == ""
    assert (await anext(chunks)).text == "one "
    waiting = asyncio.create_task(mgr.acquire("m", caller=EDITOR))
    await asyncio.sleep(0.05)
    assert not waiting.done() and engine.stopped == 0
    assert "".join([c.text async for c in chunks]) == "two"
    holder.lease.release()
    (await asyncio.wait_for(waiting, 5)).release()


async def test_the_choices_of_one_lease_stop_together_wait_again_once_and_all_start_over():
    engine, mgr, holder = await bulk_lease(slots=2)
    group = Preemptible(holder, lambda held: mgr.requeue(held))

    async def choice() -> str:
        return "".join([c.text async for c in group.generate(None, engine.generate(None))])

    answers = asyncio.gather(choice(), choice())
    for _ in range(5):
        await asyncio.sleep(0)
    editor = await asyncio.wait_for(mgr.acquire("m", caller=EDITOR), 5)
    assert engine.stopped == 2, "both choices stopped"
    assert mgr.core.queued("m") == 1, "their lease waits again once, for both slots"
    engine.go.set()
    editor.release()
    assert await asyncio.wait_for(answers, 5) == ["one two", "one two"]
    assert engine.started == 4
    assert holder.lease.slots == 2 and mgr.core.residents["m"].active == 2
    holder.lease.release()
    assert mgr.core.residents["m"].active == 0 and not mgr.core.holders


async def test_once_one_choice_has_sent_a_token_its_lease_is_kept_for_all():
    engine, mgr, holder = await bulk_lease(slots=2)
    group = Preemptible(holder, lambda held: mgr.requeue(held))
    quick, slow = asyncio.Event(), asyncio.Event()
    quick.set()
    first = group.generate(quick, engine.generate(quick))
    second = group.generate(slow, engine.generate(slow))
    assert (await anext(first)).text == "" and (await anext(second)).text == ""
    assert (await anext(first)).text == "one "
    waiting = asyncio.create_task(mgr.acquire("m", caller=EDITOR))
    await asyncio.sleep(0.05)
    assert not waiting.done() and engine.stopped == 0, "the other choice, still in prefill, is not taken back"
    slow.set()
    assert "".join([c.text async for c in second]) == "one two"
    assert "".join([c.text async for c in first]) == "two"
    holder.lease.release()
    (await asyncio.wait_for(waiting, 5)).release()
