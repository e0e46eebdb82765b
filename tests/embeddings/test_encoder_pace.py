"""Encoder passes beside a decoding model keep to its pace
(engine/generation_pace.py), on a real worker with the factory's tiny
encoder: held while the batch's pace without passes is measured, then run
again, every request answered with the vectors computed alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from engine.engine_support import run, spec_for

from mlxd.engine.embedding import EncoderEngine, load_encoder_engine
from mlxd.engine.worker import SKIP, MlxWorker

pytestmark = pytest.mark.mlx

TEXTS = ["a short one", "a somewhat longer sentence about the weather today", "x"]


def _stepping(worker: MlxWorker, period_s: float) -> object:
    """A model decoding on the worker as a batch loop does: a steady step of
    one row every turn, told to the pace keeper, ``period_s`` long."""

    def steps() -> Iterator[object]:
        while True:
            time.sleep(period_s)
            worker.pace.step(time.perf_counter(), 1, steady=True)
            yield SKIP

    return worker.stream(steps)


@pytest.fixture
def paced(tiny_embedder: Path) -> Iterator[tuple[MlxWorker, EncoderEngine]]:
    worker = MlxWorker().start()
    engine = run(load_encoder_engine(replace(spec_for(tiny_embedder, "paced"), kind="embedding"), worker,
                                     pass_thread=False))
    yield worker, engine
    run(engine.close())
    run(worker.shutdown())


def test_beside_a_decoding_model_passes_wait_for_its_pace_and_every_request_is_answered(paced) -> None:
    worker, engine = paced

    async def go() -> tuple[list[np.ndarray], list[list[np.ndarray]], dict]:
        alone = [(await engine.embed(await engine.encode([t], truncate=True)))[0] for t in TEXTS]
        assert engine.figures.paced_seconds == 0  # nothing decoding: no wait
        stream = _stepping(worker, 0.004)
        await asyncio.sleep(0.02)  # the batch's first steps are in
        encoded = [await engine.encode([t], truncate=True) for t in TEXTS]
        beside = [await asyncio.gather(*(engine.embed(e) for e in encoded)) for _ in range(10)]
        pace = engine.stats()["pace"]
        await stream.aclose()
        return alone, beside, pace

    alone, beside, pace = run(go())
    for answers in beside:
        for got, want in zip(answers, alone):
            np.testing.assert_allclose(got[0], want, atol=1e-5)
    # The passes waited while the steps without them were timed.
    assert engine.figures.paced_seconds > 0
    assert pace["decoding"] and pace["periods"] > 8


def test_an_interactive_callers_passes_are_not_held_for_the_pace(paced) -> None:
    worker, engine = paced

    async def go() -> tuple[bool, list[list[np.ndarray]]]:
        alone = [(await engine.embed(await engine.encode([t], truncate=True)))[0] for t in TEXTS]
        stream = _stepping(worker, 0.004)
        while not engine.stats()["pace"]["held"]:  # the keeper times the steps without passes
            await asyncio.sleep(0.002)
        encoded = [await engine.encode([t], truncate=True) for t in TEXTS]
        answers = await asyncio.gather(*(engine.embed(e, priority="interactive") for e in encoded))
        held = engine.stats()["pace"]["held"]
        await stream.aclose()
        for got, want in zip(answers, alone):
            np.testing.assert_allclose(got[0], want, atol=1e-5)
        return held, answers

    held, _ = run(go())
    assert held  # still measuring when the answers came...
    assert engine.figures.paced_seconds == 0  # ...and they did not wait for it
