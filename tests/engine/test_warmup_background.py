"""Where the warm-up runs: in the load when this machine's kernel cache is
known to hold the model's kernels, else after the hand-over, in the
background, never ahead of a user request and leaving no trace."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from engine.engine_support import CHAT, collect, greedy, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.warmup import BACKGROUND, LOAD, WarmupRun, decide_mode
from mlxd.engine.warmup_marker import WarmupMarker, compiled_kernels_dir, warmup_key
from mlxd.registry.device import current_device


@pytest.mark.parametrize(
    "device, known, forced, mode",
    [
        # A device that JIT-compiles: in the load only when the kernels are known compiled.
        ("cuda", True, None, LOAD),
        ("cuda", False, None, BACKGROUND),
        ("cpu", True, None, LOAD),
        ("cpu", False, None, BACKGROUND),
        # Metal ships its kernels precompiled: always quick, always in the load.
        ("metal", False, None, LOAD),
        # MLXD_WARMUP overrides; "auto" or anything else decides.
        ("cuda", True, "background", BACKGROUND),
        ("cuda", False, "load", LOAD),
        ("cuda", False, "auto", BACKGROUND),
        ("cuda", True, "bogus", LOAD),
    ],
)
def test_where_the_warmup_runs(device, known, forced, mode):
    chosen, why = decide_mode(device=device, known_compiled=known, forced=forced)
    assert chosen == mode and why


def test_the_markers_sit_beside_the_kernels_they_vouch_for(tmp_path):
    env = {"TMPDIR": "/scratch", "MLX_PTX_CACHE_DIR": "/k/ptx"}
    assert str(compiled_kernels_dir("cuda", env, "0.32.4")) == "/k/ptx"
    assert str(compiled_kernels_dir("cuda", {"TMPDIR": "/scratch"}, "0.32.4")) == "/scratch/mlx/0.32.4/ptx"
    assert str(compiled_kernels_dir("cpu", env, "0.32.4")) == "/scratch/mlx/0.32.4/cpu"
    assert str(compiled_kernels_dir("cpu", {}, "0.32.4")) == "/tmp/mlx/0.32.4/cpu"
    assert compiled_kernels_dir("metal", env, "0.32.4") is None


def test_the_marker_key_changes_with_what_decides_the_kernels(tmp_path):
    runs = (WarmupRun(32, 1, timed=True),)
    base = dict(config={"model_type": "qwen2", "hidden_size": 64}, dtypes=["float32"], kv_bits=None,
                batching=False, runs=runs, device="cuda:H200")
    key = warmup_key(**base)
    assert key == warmup_key(**{**base, "dtypes": ["float32", "float32"]})
    for change in ({"config": {"model_type": "llama", "hidden_size": 64}}, {"dtypes": ["bfloat16"]},
                   {"kv_bits": 8}, {"batching": True}, {"runs": (replace(runs[0], prompt_tokens=64),)},
                   {"device": "cpu:cpu"}):
        assert warmup_key(**{**base, **change}) != key, change
    marker = WarmupMarker(tmp_path / "ptx", key)
    assert not marker.known()
    marker.write("qwen", {"seconds": 1.0})
    assert marker.known() and marker.path.parent.parent == tmp_path / "ptx"


async def _warmup_in_flight(engine) -> None:
    while not any(c.warmup for c in engine._in_flight):
        await asyncio.sleep(0.005)


@pytest.mark.mlx
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_background_warmup_answers_the_first_request_first_and_leaves_its_cache(worker, qwen_tiny, concurrency):
    from engine.test_engine_text import direct_mlx_lm

    expected = direct_mlx_lm(worker, qwen_tiny, CHAT, 24)

    async def scenario():
        engine = await load_text_engine(spec_for(qwen_tiny, max_concurrency=concurrency), worker,
                                        warmup="background")
        try:
            assert engine.warmup.mode == BACKGROUND and not engine.warmup.done
            first = await collect(engine, greedy("first"))
            # Answered before the warm-up ran any of its requests.
            assert not engine.warmup.done and engine.warmup.requests == 0
            before = engine.stats()
            await engine.background_warmup.wait()
            report, after = engine.warmup, engine.stats()
            return first, before, report, after, await collect(engine, greedy("again"))
        finally:
            await engine.close()

    first, before, report, after, again = asyncio.run(scenario())
    assert text_of(first) == expected
    assert report.done and report.error is None and report.mode == BACKGROUND
    assert report.requests == (3 if current_device().kind == "cpu" else 5 + (4 if concurrency > 1 else 0))
    assert report.prefill_tokens_per_s > 0
    # The user's figures and cache entry are as the first request left them.
    assert before["prefix_cache"]["memory_entries"] >= 1
    for figure in ("generations", "prompt_tokens", "tokens_generated", "aborted"):
        assert after[figure] == before[figure], figure
    assert after["prefix_cache"] == before["prefix_cache"]
    # ... and the next turn is served from it, greedy text unchanged.
    assert text_of(again) == expected and again[-1].cached_tokens > 0


@pytest.mark.mlx
def test_a_user_request_pushes_a_running_warmup_aside(worker, qwen_tiny):
    from engine.test_engine_text import direct_mlx_lm

    expected = direct_mlx_lm(worker, qwen_tiny, CHAT, 24)

    async def scenario():
        engine = await load_text_engine(spec_for(qwen_tiny), worker, warmup="background")
        try:
            await _warmup_in_flight(engine)
            answer = await collect(engine, greedy("user"))
            await engine.background_warmup.wait()
            return answer, engine.warmup, engine.stats()
        finally:
            await engine.close()

    answer, report, stats = asyncio.run(scenario())
    assert text_of(answer) == expected and answer[-1].finish_reason == "length"
    # The run it interrupted was run again: the warm-up still completed.
    assert report.preempted >= 1 and report.done and report.error is None and report.prefill_tokens_per_s > 0
    assert (stats["generations"], stats["aborted"]) == (1, 0)


@pytest.mark.mlx
def test_an_unload_during_a_background_warmup_is_clean(worker, qwen_tiny):
    async def scenario():
        engine = await load_text_engine(spec_for(qwen_tiny, max_concurrency=2), worker, warmup="background")
        await _warmup_in_flight(engine)
        await engine.close()
        task = engine.background_warmup._task
        # The worker is free for the next model, and the engine refuses new work.
        assert await worker.call(lambda: 7) == 7
        return engine, task

    engine, task = asyncio.run(scenario())
    assert task.done() and engine.stats()["closed"] and engine.stats()["running"] == 0
    assert not engine.warmup.done


@pytest.mark.mlx
def test_a_completed_warmup_makes_the_next_load_warm_in_the_load(worker, qwen_tiny, tmp_path, monkeypatch):
    """``auto``: no marker in a fresh kernel folder, so the first load warms
    in the background; once that finished, the next load of the same model
    knows its kernels are compiled and warms before the hand-over."""
    monkeypatch.delenv("MLXD_WARMUP", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "ptx"))
    # Metal has no kernel folder to vouch for: it always warms in the load.
    metal = current_device().kind == "metal"

    async def scenario():
        first = await load_text_engine(spec_for(qwen_tiny), worker)
        modes = [first.warmup.mode]
        if first.background_warmup is not None:
            await first.background_warmup.wait()
        await first.close()
        second = await load_text_engine(spec_for(qwen_tiny), worker)
        await second.close()
        return modes + [second.warmup.mode], second.warmup

    modes, report = asyncio.run(scenario())
    assert modes == ([LOAD, LOAD] if metal else [BACKGROUND, LOAD])
    assert report.done and report.requests > 0
    assert bool(list(tmp_path.rglob("mlxd-warmed/*"))) is not metal
