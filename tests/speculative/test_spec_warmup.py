"""A speculating model's warm-up verifies a block of every width, 1 to K + 1,
at every batch size it may run, before users do (on CUDA, each such shape's
first steps ran 2-5 times slower than later ones: the governor would have
timed them as speculation's cost), and nothing of it is counted: the
governor has no measurement and status no speculative step once it is done."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.warmup import plan_warmup, speculative_runs, warm_up
from mlxd.engine.worker import MlxWorker
from mlxd.registry.model import SpeculativeSpec

K = 3
PROMPT = "def parse_arguments(argv):\n    parser = argparse.ArgumentParser("


class RecordingModel:
    """The real model; each call's (rows, positions) noted."""

    def __init__(self, model: Any, seen: set[tuple[int, int]]) -> None:
        self._model, self._seen = model, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, inputs: Any, cache: Any = None) -> Any:
        self._seen.add((int(inputs.shape[0]), int(inputs.shape[1])))
        return self._model(inputs, cache=cache)


@pytest.fixture(scope="module")
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


def test_the_gpu_plan_warms_each_batch_size_of_a_speculating_model() -> None:
    plain = plan_warmup(max_context=4096, prefill_chunk=512, max_concurrency=3, batching=True)
    plan = plan_warmup(max_context=4096, prefill_chunk=512, max_concurrency=3, batching=True, speculative_tokens=K)
    assert plan[: len(plain)] == plain
    assert plan[len(plain):] == tuple(speculative_runs(16, K, 3))
    assert [(r.concurrent, r.max_tokens) for r in plan[len(plain):]] == [(1, 14), (2, 14), (3, 14)]
    # Not on the CPU: its kernels are compiled per operation, not per shape.
    assert plan_warmup(max_context=4096, prefill_chunk=512, max_concurrency=3, batching=True, device="cpu",
                       speculative_tokens=K) == plan_warmup(max_context=4096, prefill_chunk=512, max_concurrency=3,
                                                            batching=True, device="cpu")


@pytest.mark.mlx
def test_the_warm_up_verifies_every_width_at_every_batch_size_and_counts_nothing(worker: MlxWorker) -> None:
    from mlxd.factory.zoo_build import build_family

    path = build_family("qwen3")
    engine = run(load_text_engine(spec_for(path, "warm", max_concurrency=3,
                                           speculative=SpeculativeSpec("prompt_lookup", K)), worker))
    plain = run(load_text_engine(spec_for(path, "plain", max_concurrency=3), worker))
    try:
        seen: set[tuple[int, int]] = set()
        speculation = engine.speculation
        build = speculation.generator

        def recording(model: Any) -> Any:
            generator = build(model)
            generator.model = RecordingModel(model, seen)
            return generator

        speculation.generator = recording
        before = engine.stats()["speculative"]
        report = run(warm_up(engine, speculative_runs(16, K, 3), max_chars=4000))
        assert report.error is None and report.requests == 6
        assert {(rows, width) for rows in (1, 2, 3) for width in range(1, K + 2)} <= seen, sorted(seen)
        status = engine.stats()["speculative"]
        assert status == before and status["verify_steps"] == 0 and status["speedup"] is None and status["active"]
        # A user's greedy answer afterwards is the plain model's, and it is
        # counted (the prompt holds the model's own answer to its end, so
        # lookup has something to draft from, as in test_spec_engine.py).
        prompt = PROMPT
        for _ in range(2):
            prompt = PROMPT + text_of(run(collect(plain, greedy("seed", 24, prompt=prompt)))) + "\n" + PROMPT
        asked = greedy("user", 24, prompt=prompt)
        assert text_of(run(collect(engine, asked))) == text_of(run(collect(plain, asked)))
        assert engine.stats()["speculative"]["verify_steps"] > 0
    finally:
        run(engine.close())
        run(plain.close())
