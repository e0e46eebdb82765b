"""The encoder engine on a real worker with the factory's tiny models:
concurrent requests share forward passes, and a row's vector does not
depend on what it was batched with."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.engine_support import run, spec_for
from mlxd.engine.embedding import EncoderEngine, load_encoder_engine
from mlxd.engine.worker import MlxWorker

pytestmark = pytest.mark.mlx

TEXTS = ["a short one", "a somewhat longer sentence about the weather today",
         "x", "numbers 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"]


@pytest.fixture
def embedder(tiny_embedder: Path) -> Iterator[EncoderEngine]:
    worker = MlxWorker().start()
    spec = replace(spec_for(tiny_embedder, "embed"), kind="embedding", batch_tokens=4096)
    engine = run(load_encoder_engine(spec, worker))
    yield engine
    run(engine.close())
    run(worker.shutdown())


def test_concurrent_requests_share_one_forward_pass(embedder: EncoderEngine) -> None:
    async def go() -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        alone = []
        for text in TEXTS:
            alone.extend(await embedder.embed(await embedder.encode([text], truncate=True)))
        before = embedder.figures.batches
        encoded = [await embedder.encode([t], truncate=True) for t in TEXTS]
        together = await asyncio.gather(*(embedder.embed(e) for e in encoded))
        assert embedder.figures.batches == before + 1
        return alone, together

    alone, together = run(go())
    for one, shared in zip(alone, together):
        # Padding to the batch's longest row changes nothing.
        np.testing.assert_allclose(shared[0], one, atol=1e-5)


def test_a_request_gets_its_vectors_in_its_input_order(embedder: EncoderEngine) -> None:
    async def go() -> tuple[list[np.ndarray], list[np.ndarray]]:
        forward = await embedder.embed(await embedder.encode(TEXTS, truncate=True))
        backward = await embedder.embed(await embedder.encode(TEXTS[::-1], truncate=True))
        return forward, backward

    forward, backward = run(go())
    for a, b in zip(forward, backward[::-1]):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_small_batch_bound_splits_the_work_and_keeps_the_answers(tiny_embedder: Path) -> None:
    worker = MlxWorker().start()
    small = run(load_encoder_engine(replace(spec_for(tiny_embedder, "small"), kind="embedding",
                                            batch_tokens=16), worker))
    try:
        async def go() -> list[np.ndarray]:
            return await small.embed(await small.encode(TEXTS, truncate=True))

        vectors = run(go())
        assert small.figures.batches >= 3
        assert small.figures.padded_tokens <= small.figures.batches * 16 + 32
        # Each pass's time on the worker is counted: an operator sets it
        # against the requests' whole time.
        assert 0 < small.stats()["pass_seconds"] == round(small.figures.pass_seconds, 6)
        assert [v.shape for v in vectors] == [(64,)] * len(TEXTS)
    finally:
        run(small.close())
        run(worker.shutdown())


def test_a_client_that_leaves_takes_its_waiting_inputs_out(embedder: EncoderEngine) -> None:
    async def go() -> int:
        encoded = await embedder.encode(TEXTS * 50, truncate=True)
        task = asyncio.ensure_future(embedder.embed(encoded))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(embedder._queue)

    assert run(go()) == 0
