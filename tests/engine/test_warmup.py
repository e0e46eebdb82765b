"""A text model is warmed up before the loader hands it over (so before the
daemon reports it `loaded`), and warming changes nothing a user sees."""

from __future__ import annotations

import httpx
import pytest
from engine.engine_support import CHAT, collect, greedy, run, spec_for, text_of
from support.daemon import daemon_in_thread, write_registry

from mlxd.engine.loader import load_text_engine
from mlxd.engine.warmup import CPU_PREFILL_TOKENS, WarmupRun, plan_warmup
from mlxd.registry.device import current_device


# Sampling's kernels: two short requests, with a seed (and penalties, logprobs) and without.
SAMPLED = WarmupRun(16, 3, 2, kind="sampled")
CPU_SAMPLED = WarmupRun(4, 1, 2, kind="sampled")
# ... and on GPUs one under a JSON grammar, after the timed chunk.
CONSTRAINED = WarmupRun(16, 3, kind="constrained")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        # One sequence on a GPU: two full prefill chunks plus a rest, sampling, a timed chunk, a grammar.
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=1, batching=False),
         (WarmupRun(1040, 3), SAMPLED, WarmupRun(512, 1, timed=True), CONSTRAINED)),
        # Batching adds short requests at once sharing one sampler, at every
        # batch size it may run (2 to 8): a batch size's first use compiles.
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=8, batching=True),
         (WarmupRun(1040, 3), *(WarmupRun(16, 3, rows, kind="shared", staggered=True) for rows in range(2, 9)),
          SAMPLED, WarmupRun(512, 1, timed=True), CONSTRAINED)),
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=16, batching=True),
         (WarmupRun(1040, 3), *(WarmupRun(16, 3, rows, kind="shared", staggered=True) for rows in range(2, 9)),
          SAMPLED, WarmupRun(512, 1, timed=True), CONSTRAINED)),
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=2, batching=True),
         (WarmupRun(1040, 3), WarmupRun(16, 3, 2, kind="shared", staggered=True), SAMPLED, WarmupRun(512, 1, timed=True),
          CONSTRAINED)),
        # max_concurrency > 1 on a model that cannot batch: no batched run.
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=4, batching=False),
         (WarmupRun(1040, 3), SAMPLED, WarmupRun(512, 1, timed=True), CONSTRAINED)),
        # A short context caps every prompt below it.
        (dict(max_context=200, prefill_chunk=512, max_concurrency=1, batching=False),
         (WarmupRun(181, 3), SAMPLED, WarmupRun(181, 1, timed=True), CONSTRAINED)),
        # The CPU keeps its compiled kernels on disk, so the warm-up saves it
        # nothing but the sampling kernels: a short sampled pair side by side
        # (one token each; a batching model batches it), then the timed
        # prompt (the prefill speed).
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=1, batching=False, device="cpu"),
         (CPU_SAMPLED, WarmupRun(CPU_PREFILL_TOKENS, 1, timed=True))),
        (dict(max_context=4096, prefill_chunk=512, max_concurrency=8, batching=True, device="cpu"),
         (CPU_SAMPLED, WarmupRun(CPU_PREFILL_TOKENS, 1, timed=True))),
    ],
)
def test_the_warmup_plan(kwargs, expected):
    assert plan_warmup(**kwargs) == expected


@pytest.mark.mlx
@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_loader_returns_a_warm_engine_with_nothing_left_of_the_warmup(worker, qwen_tiny, concurrency):
    from engine.test_engine_text import direct_mlx_lm

    engine = run(load_text_engine(spec_for(qwen_tiny, max_concurrency=concurrency), worker))
    try:
        report = engine.warmup
        stats = engine.stats()
        assert report is not None and report.error is None
        # It really ran through the engine: the batched path too when batching.
        on_cpu = current_device().kind == "cpu"
        # The CPU: the sampled pair (batched when batching), timed; GPUs add batches of 2, 3 and 4.
        wide, alone = (0, 3) if on_cpu else (2 + 3 + 4, 5)
        assert report.requests == (alone + wide if concurrency == 4 else alone)
        assert stats["batching"] is (concurrency > 1)
        if concurrency > 1 and not on_cpu:
            # The CPU's one-token pair ends at the token its prefill draws.
            assert stats["batched_steps"] > 0
        assert report.seconds > 0 and report.prefill_tokens_per_s > 0
        assert stats["warmup"] == report.as_dict()
        # ... and left nothing a user would see: no counts, no cache entries.
        assert (stats["generations"], stats["tokens_generated"]) == (0, 0)
        cache = stats["prefix_cache"]
        assert (cache["memory_entries"], cache["hits"], cache["misses"]) == (0, 0, 0)
        # The first user's greedy answer is plain mlx-lm's.
        first = text_of(run(collect(engine, greedy("first"))))
        assert first == direct_mlx_lm(worker, qwen_tiny, CHAT, 24)
    finally:
        run(engine.close())


@pytest.mark.mlx
def test_status_says_loaded_only_once_the_warmup_is_done(tmp_path):
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen", "max_concurrency": 2}])
    with daemon_in_thread(registry, tmp_path) as d:
        assert d.model("qwen")["state"] == "unloaded"
        assert httpx.post(f"{d.url}/v1/models/qwen/load", json={}, timeout=120).status_code == 200
        status = d.model("qwen")
        assert status["state"] == "loaded"
        warmup = status["engine"]["warmup"]
        # GPUs: long, 2 at once, 2 sampled, timed, a grammar; the CPU: 2 sampled, timed
        assert warmup["requests"] == (3 if current_device().kind == "cpu" else 7) and warmup["error"] is None and warmup["seconds"] > 0
        assert status["engine"]["generations"] == 0


def test_a_shared_batch_sends_one_set_of_sampling_values_so_the_batch_draws_in_one_call():
    """Every request of a "shared" run has the same values and no seed, so
    the batch gives them one sampler (BatchScheduler._sampler) and its
    kernels run at that batch size; a "sampled" pair differs (one seeded)."""
    from mlxd.engine.warmup import batch_runs, warmup_request

    run_ = batch_runs(16, 4)[-1]
    shared = [warmup_request(run_, i, "text", f"w{i}", chat=False) for i in range(4)]
    assert len({r.sampling for r in shared}) == 1
    assert shared[0].sampling.seed is None and shared[0].sampling.temperature > 0
    pair = [warmup_request(SAMPLED, i, "text", f"s{i}", chat=False) for i in range(2)]
    assert pair[0].sampling != pair[1].sampling
    # The batch's rows end one step apart: each leaves a batch that goes on (its filter's gathers compile).
    assert [r.max_tokens for r in shared] == [3, 4, 5, 6]
    assert [r.max_tokens for r in pair] == [3, 3]


@pytest.mark.mlx
def test_a_batched_warm_up_lets_rows_leave_a_batch_that_goes_on(worker, qwen_tiny, monkeypatch):
    """A GPU's batched warm-up compiles what a row leaving a running batch
    costs (the filter's gathers: NVRTC on first use), so its rows end one
    step apart: every batch it runs shrinks through every size to one, and
    does not only end whole."""
    from mlx_lm.generate import GenerationBatch

    from mlxd.engine.warmup import batch_runs, warm_up

    engine = run(load_text_engine(spec_for(qwen_tiny, "stagger", max_concurrency=4), worker))
    kept: list[int] = []
    original = GenerationBatch.filter

    def recording(self, keep):
        kept.append(len(keep))
        return original(self, keep)

    monkeypatch.setattr(GenerationBatch, "filter", recording)
    try:
        report = run(warm_up(engine, batch_runs(16, 4), max_chars=4000))
        assert report.error is None and report.requests == 2 + 3 + 4
        # Batches of 2, 3 and 4 rows: each row but the last leaves one that goes on.
        assert sorted(k for k in kept if k) == sorted([1] + [2, 1] + [3, 2, 1])
    finally:
        run(engine.close())
