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
from mlxd.engine.embedding_model import Encoded
from mlxd.engine.worker import MlxWorker
from mlxd.errors import ModelUnloaded

pytestmark = pytest.mark.mlx

TEXTS = ["a short one", "a somewhat longer sentence about the weather today",
         "x", "numbers 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"]


def _assert_rotations_match(alone: list[np.ndarray], rotated: list[list[np.ndarray]]) -> None:
    """Request i embedded TEXTS rotated by i: its vectors are ``alone``'s,
    rotated alike, whatever batches they shared."""
    for i, vectors in enumerate(rotated):
        for got, want in zip(vectors, alone[i:] + alone[:i]):
            np.testing.assert_allclose(got, want, atol=1e-5)


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


def _decoding(worker: MlxWorker, steps: list[int]) -> object:
    """Another model decoding on the same worker: a stream that takes a turn
    in the ring every cycle (recording the worker's step count) until dropped."""
    from mlxd.engine.worker import SKIP

    def forever() -> Iterator[object]:
        while True:
            steps.append(worker.steps)
            yield SKIP

    return worker.stream(forever)


def test_beside_a_decoding_stream_each_pass_is_read_back_a_turn_later_with_the_same_vectors(
        tiny_embedder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While another model decodes, a pass is queued on the device in one
    turn and read back in the next (which queues the next batch), so the
    decode steps run between them instead of after a pass waited for in
    full. The vectors and their order are the ones computed alone; a
    request still waits only for its own inputs."""
    worker = MlxWorker().start()
    engine = run(load_encoder_engine(replace(spec_for(tiny_embedder, "paced"), kind="embedding",
                                             batch_tokens=32), worker, pass_thread=False))
    exchanges: list[int] = []
    original = EncoderEngine._exchange

    def recorded(self: EncoderEngine, ahead: object, batch: object) -> object:
        exchanges.append(worker.steps)
        return original(self, ahead, batch)

    monkeypatch.setattr(EncoderEngine, "_exchange", recorded)
    others: list[int] = []
    try:
        async def go() -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
            alone = await engine.embed(await engine.encode(TEXTS, truncate=True))  # the peak's pass: waited for
            assert exchanges == []
            stream = _decoding(worker, others)
            await asyncio.sleep(0.05)
            encoded = [await engine.encode(TEXTS[i:] + TEXTS[:i], truncate=True) for i in range(len(TEXTS))]
            beside = await asyncio.gather(*(engine.embed(e) for e in encoded))
            await stream.aclose()
            return alone, beside

        alone, beside = run(go())
        _assert_rotations_match(alone, beside)
        # Several batches (32 padded tokens each), each queued in one turn and read back in the next...
        assert len(exchanges) >= 3
        # ...with the decoding stream's step between every two of them.
        for before, after in zip(exchanges, exchanges[1:]):
            assert any(before < step < after for step in others), (exchanges, others)
        assert not engine._busy()
    finally:
        run(engine.close())
        run(worker.shutdown())


def test_closing_while_a_pass_is_on_the_device_waits_for_it_and_answers_every_request(tiny_embedder: Path) -> None:
    """An unload that comes while a pass is queued on the device and not read
    back waits for it before it releases the model; every request then has
    its answer (the unload's error, as for a batch waited for in its turn)
    and none hangs."""
    worker = MlxWorker().start()
    engine = run(load_encoder_engine(replace(spec_for(tiny_embedder, "closing"), kind="embedding",
                                             batch_tokens=32), worker, pass_thread=False))
    others: list[int] = []

    async def go() -> list[object]:
        await engine.embed(await engine.encode(["the peak's pass"], truncate=True))
        stream = _decoding(worker, others)
        await asyncio.sleep(0.05)
        pending = [asyncio.ensure_future(engine.embed(await engine.encode(TEXTS, truncate=True))) for _ in range(3)]
        while engine._ahead is None:
            await asyncio.sleep(0)
        await engine.close()
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        await stream.aclose()
        return outcomes

    try:
        outcomes = run(go())
        assert engine.encoder is None and not engine._busy()
        assert all(isinstance(o, ModelUnloaded) for o in outcomes), outcomes
    finally:
        run(worker.shutdown())


def test_on_a_thread_of_their_own_the_passes_give_the_same_vectors_while_another_model_decodes(
        tiny_embedder: Path) -> None:
    """On CUDA an encoder's passes after the first run on a thread of their
    own (``passes_on_own_thread``), so queueing them does not take the MLX
    worker's time from a decoding stream. Forced on here: the first pass
    (whose peak is measured) still runs on the worker, the rest on the
    engine's own thread, with the vectors and their order the worker gives,
    while the worker goes on stepping another model; closing the engine
    ends that thread."""
    import threading

    worker = MlxWorker().start()
    spec = replace(spec_for(tiny_embedder, "apart"), kind="embedding", batch_tokens=32)
    engine = run(load_encoder_engine(spec, worker, pass_thread=True))
    on_worker = run(load_encoder_engine(replace(spec, name="together"), worker, pass_thread=False))
    ran_on: list[str] = []
    original = engine._step

    def recorded(batch: object) -> object:
        ran_on.append(threading.current_thread().name)
        return original(batch)

    engine._step = recorded  # type: ignore[method-assign]
    others: list[int] = []
    try:
        async def go() -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
            await engine.embed(await engine.encode(["the peak's pass"], truncate=True))
            alone = await on_worker.embed(await on_worker.encode(TEXTS, truncate=True))
            stream = _decoding(worker, others)
            await asyncio.sleep(0.05)
            encoded = [await engine.encode(TEXTS[i:] + TEXTS[:i], truncate=True) for i in range(len(TEXTS))]
            decoded_before = len(others)
            apart = await asyncio.gather(*(engine.embed(e) for e in encoded))
            assert len(others) > decoded_before  # the worker kept stepping the other model
            await stream.aclose()
            return alone, apart

        alone, apart = run(go())
        _assert_rotations_match(alone, apart)
        assert ran_on[0] == "mlx-worker"
        assert len(ran_on) >= 4 and set(ran_on[1:]) == {"mlx-passes:apart"}
        assert engine.stats()["pass_thread"] is True and on_worker.stats()["pass_thread"] is False
        lane = engine._pass_thread
        run(engine.close())
        assert engine.encoder is None and not engine._busy()
        assert lane is not None and not lane.running
        with pytest.raises(ModelUnloaded):
            run(engine.embed(Encoded([[5, 6, 7]], None, [])))
    finally:
        run(engine.close())
        run(on_worker.close())
        run(worker.shutdown())


def test_this_machine_runs_passes_apart_only_on_cuda() -> None:
    import mlx.core as mx

    from mlxd.engine.embedding import passes_on_own_thread

    assert passes_on_own_thread() is mx.cuda.is_available()


def test_a_compiled_encoder_gives_the_same_vectors_and_scores_and_drops_its_padding_rows(
        tiny_embedder: Path, tiny_reranker: Path) -> None:
    from mlxd.engine.embedding_batch import Batch, Row
    from mlxd.engine.embedding_model import LoadedEncoder, load_cross_encoder, load_embedder
    from mlxd.engine.host_arrays import to_numpy

    # 3 rows of up to 11 tokens run at the bucket 4 x 16: a padding row, and
    # padding columns, that change nothing.
    batch = Batch(tuple(Row(0, i, tuple(range(5, 5 + n)), (0, 0) + (1,) * (n - 2))
                        for i, n in enumerate((3, 7, 11))))
    for load, run_pass in ((load_embedder, "embed"), (load_cross_encoder, "score")):
        plain, _ = load(tiny_embedder if run_pass == "embed" else tiny_reranker)
        compiled = LoadedEncoder(plain.model, plain.recipe, head=plain.head, activation=plain.activation,
                                 pad_id=plain.pad_id, dimensions=plain.dimensions, compiled=True)
        want = to_numpy(getattr(plain, run_pass)(batch))
        for _ in range(2):  # traced, then replayed
            got = to_numpy(getattr(compiled, run_pass)(batch))
            assert got.shape == want.shape and np.isfinite(got).all()
            np.testing.assert_allclose(got, want, atol=1e-5)
        assert len(compiled._compiled) == 1
        compiled.model = None  # unloaded: the traces go with the functions
        assert not compiled._compiled
