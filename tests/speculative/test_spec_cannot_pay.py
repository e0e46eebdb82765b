"""A draft as large as its target can never pay (SpeculativeSpec.cannot_pay):
the engine decodes as without `speculative:`, the draft never loaded, and
says why; `auto_off: false` speculates with it anyway."""

from __future__ import annotations

import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.worker import MlxWorker
from mlxd.factory.zoo_build import build_family
from mlxd.registry.model import SpeculativeSpec

pytestmark = pytest.mark.mlx

PROMPT = "def parse(line):\n    return line.split(',')\n\ndef parse(line):\n"


def test_a_draft_the_targets_size_is_left_off_unloaded_and_said_why():
    path = build_family("qwen3")
    worker = MlxWorker().start()

    async def serve() -> None:
        plain = await load_text_engine(spec_for(path, "plain", max_concurrency=2), worker)
        twin = await load_text_engine(spec_for(path, "twin", max_concurrency=2, speculative=SpeculativeSpec(
            "draft", 4, "self", path, draft_ratio=1.0)), worker)
        forced = await load_text_engine(spec_for(path, "forced", max_concurrency=2, speculative=SpeculativeSpec(
            "draft", 4, "self", path, draft_ratio=1.0, auto_off=False)), worker)
        try:
            want = text_of(await collect(plain, greedy("p", 24, prompt=PROMPT)))
            assert text_of(await collect(twin, greedy("t", 24, prompt=PROMPT))) == want
            status = twin.stats()["speculative"]
            assert "gains at most 1.00x" in status["unsupported"] and status["active"] is False
            assert twin.speculation.draft_model is None and status["verify_steps"] == 0
            assert text_of(await collect(forced, greedy("f", 24, prompt=PROMPT))) == want
            held = forced.stats()["speculative"]
            assert held["unsupported"] is None and held["active"] is True and held["drafted_tokens"] > 0
        finally:
            for engine in (plain, twin, forced):
                await engine.close()

    try:
        run(serve())
    finally:
        run(worker.shutdown())
