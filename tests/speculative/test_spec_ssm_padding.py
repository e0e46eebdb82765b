"""Nemotron-H (Mamba-2 layers beside attention) decodes speculatively in a
batch byte-identically to decoding without speculation.

When the rows of a hybrid batch keep different numbers of their drafts, the
batch restores the state layers and replays each row's kept tokens right-
padded (engine/speculative_cache.py, ``replay``). mlx-lm 0.32.2's nemotron_h
mixer did not hand the padded rows' lengths to its SSM, so a row shorter
than the longest ended with a state that had dropped the tokens it kept:
the model as its own draft (rows keep most of their drafts, not all, and
not the same number) wrote other text for three rows of four."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.worker import MlxWorker
from mlxd.registry.model import SpeculativeSpec

PROMPTS = [
    "The license grants permission to copy and distribute the software",
    "for options report parse read init grants file return class self distribute license in import the print parse",
    "def parse_arguments(argv):\n    parser = argparse.ArgumentParser(",
    "Read the configuration file and report the options",
]
# Which rows keep how many drafts in the same step depends on when each
# joins the batch: three lengths, so that some step replays unequal rows.
LIMITS = (40, 46, 64)


@pytest.fixture(scope="module")
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


def test_nemotron_h_drafting_for_itself_in_a_batch_is_byte_identical(worker: MlxWorker) -> None:
    from mlxd.factory.zoo_build import build_family

    path = build_family("nemotron_h")

    async def main() -> tuple[list[list[str]], list[list[str]], dict]:
        plain = await load_text_engine(spec_for(path, "plain", max_concurrency=1), worker)
        spec = SpeculativeSpec("draft", 4, "self", path, auto_off=False)
        draft = await load_text_engine(spec_for(path, "draft", max_concurrency=4, speculative=spec), worker)
        want, got = [], []
        try:
            for limit in LIMITS:
                want.append([text_of(await collect(plain, greedy("ref", limit, prompt=p))) for p in PROMPTS])
                outs = await asyncio.gather(*[collect(draft, greedy(f"b{i}", limit, prompt=p))
                                              for i, p in enumerate(PROMPTS)])
                got.append([text_of(o) for o in outs])
            return want, got, draft.stats()["speculative"]
        finally:
            await plain.close()
            await draft.close()

    want, got, status = run(main())
    assert status["unsupported"] is None and status["accepted_tokens"] > 0, status
    assert got == want
