"""Speculative decoding gives the same greedy text as decoding without it,
alone and in a batch of four, under a grammar, with stop strings,
penalties, logit_bias and logprobs, across a prefix-cache hit, on a dense
(qwen3), a hybrid (qwen3_next: linear-attention state + KV) and two
sliding-window zoo models (gemma3_text, gpt_oss: a 32-token window, which
every prompt here outgrows, so rows roll back after the window wrapped),
each by prompt lookup and by its own weights as the draft.

The prompts are built so that drafts get accepted: a prompt, the model's own
answer to it and the prompt again (as a coding agent's edit repeats the file
it was given), so rows keep different numbers of drafts and roll back
differently in the same step."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine.engine_support import after_acceptance, collect, greedy, is_acceptance, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.text import TextEngine
from mlxd.engine.types import Constraint, SamplingParams
from mlxd.engine.worker import MlxWorker
from mlxd.registry.model import SpeculativeSpec

SEEDS = [
    "def parse_arguments(argv):\n    parser = argparse.ArgumentParser(",
    "Read the configuration file and report the options",
    "import os\nimport sys\nfor name in os.listdir(path):\n    print(name)\n",
    "The license grants permission to copy and distribute the software",
]
TOKENS = 32


# gpt_oss's random weights never repeat what they wrote, so no draft of
# theirs is kept: every block is dropped whole (after the window wrapped),
# and the rows' different roll-backs are gemma3_text's to show.
REPEATS = {"qwen3": True, "qwen3_next": True, "gemma3_text": True, "gpt_oss": False}


class Models:
    def __init__(self, family: str, plain: TextEngine, lookup: TextEngine, draft: TextEngine, prompts: list[str],
                 reference: list[str]) -> None:
        self.family, self.plain, self.lookup, self.draft = family, plain, lookup, draft
        self.prompts, self.reference = prompts, reference


@pytest.fixture(scope="module")
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


@pytest.fixture(scope="module", params=list(REPEATS))
def models(request: pytest.FixtureRequest, worker: MlxWorker) -> Iterator[Models]:
    from mlxd.factory.zoo_build import build_family

    path: Path = build_family(request.param)

    async def load() -> Models:
        plain = await load_text_engine(spec_for(path, "plain", max_concurrency=4), worker)
        # auto_off: false: these tests are about what verification writes, so
        # it must run whatever the governor would measure of these random
        # weights' drafts on a loaded machine (its own tests are below).
        lookup = await load_text_engine(spec_for(path, "lookup", max_concurrency=4,
                                                 speculative=SpeculativeSpec("prompt_lookup", 4, auto_off=False)),
                                        worker)
        # The model as its own draft: nearly every draft is kept.
        draft = await load_text_engine(spec_for(path, "draft", max_concurrency=4,
                                                speculative=SpeculativeSpec("draft", 3, "self", path, auto_off=False)),
                                       worker)
        first = await asyncio.gather(*[collect(plain, greedy(f"s{i}", TOKENS, prompt=p)) for i, p in enumerate(SEEDS)])
        prompts = [p + text_of(o) + "\n" + p for p, o in zip(SEEDS, first)]
        # Once more with the answer to the repeated prompt in the middle: the
        # first token (drawn as the prompt is prefilled, with nothing to
        # draft) then mostly follows the prompt's end as it did in the middle,
        # so lookup has an n-gram to draft from at once, even on gpt_oss.
        again = [await collect(plain, greedy("again", TOKENS, prompt=p)) for p in prompts]
        prompts = [p + text_of(o) + "\n" + p for p, o in zip(SEEDS, again)]
        reference = [text_of(await collect(plain, greedy("ref", TOKENS, prompt=p))) for p in prompts]
        return Models(request.param, plain, lookup, draft, prompts, reference)

    loaded = run(load())
    yield loaded
    for engine in (loaded.plain, loaded.lookup, loaded.draft):
        run(engine.close())


def _engines(m: Models) -> list[TextEngine]:
    """The speculating engines: prompt lookup, and the model as its own
    draft (a hybrid or sliding-window draft puts its state and window back
    after its one-token steps, which cannot be given back otherwise)."""
    for engine in (m.lookup, m.draft):
        assert engine.stats()["speculative"]["unsupported"] is None, engine.stats()["speculative"]
    return [m.lookup, m.draft]


async def _batch(engine: TextEngine, requests: list[Any]) -> list[Any]:
    return await asyncio.gather(*[collect(engine, r) for r in requests])


def test_a_batch_of_four_is_byte_identical_and_keeps_drafts(models: Models) -> None:
    for engine in _engines(models):
        before = engine.stats()["speculative"]
        outs = run(_batch(engine, [greedy(f"b{i}", TOKENS, prompt=p) for i, p in enumerate(models.prompts)]))
        assert [text_of(o) for o in outs] == models.reference, engine.spec.name
        status = engine.stats()["speculative"]
        assert status["drafted_tokens"] > before["drafted_tokens"], status
        if REPEATS[models.family]:
            assert status["accepted_tokens"] > before["accepted_tokens"], status
        if engine is models.draft:
            # Its own weights: a draft cache put back wrong (a state that has
            # absorbed rejected drafts, a window rotated over) would draft worse.
            kept = status["accepted_tokens"] - before["accepted_tokens"]
            assert kept > 0.8 * (status["drafted_tokens"] - before["drafted_tokens"]), status
        assert set(status) >= {"method", "tokens", "acceptance_rate", "accepted_per_step", "speedup", "active"}


async def _first_text_then_rest(engine: TextEngine, request: Any, started: asyncio.Event) -> list[Any]:
    chunks = []
    async for chunk in engine.generate(request):
        chunks.append(chunk)
        if chunk.text:
            started.set()
    return after_acceptance(chunks)


def test_rows_joining_a_running_batch_are_byte_identical(models: Models) -> None:
    """Two rows decode, then two more join between their steps: a draft
    model prefills the joined rows' draft caches in the next draft it makes
    (the first two keep theirs), prompt lookup indexes them, and every text
    is the one decoding without speculation gives."""

    async def staggered(engine: TextEngine) -> list[Any]:
        events = [asyncio.Event(), asyncio.Event()]
        first = [asyncio.ensure_future(_first_text_then_rest(engine, greedy(f"j{i}", TOKENS, prompt=p), e))
                 for i, (p, e) in enumerate(zip(models.prompts[:2], events))]
        await asyncio.gather(*(e.wait() for e in events))
        later = [collect(engine, greedy(f"j{i + 2}", TOKENS, prompt=p)) for i, p in enumerate(models.prompts[2:])]
        return list(await asyncio.gather(*first, *later))

    for engine in _engines(models):
        before = engine.stats()["speculative"]["drafted_tokens"]
        outs = run(staggered(engine))
        assert [text_of(o) for o in outs] == models.reference, engine.spec.name
        assert engine.stats()["speculative"]["drafted_tokens"] > before, engine.spec.name


def test_a_single_stream_is_byte_identical(models: Models) -> None:
    for engine in _engines(models):
        assert text_of(run(collect(engine, greedy("one", TOKENS, prompt=models.prompts[2])))) == models.reference[2]


def test_stop_strings_cut_at_the_same_place(models: Models) -> None:
    ref = models.reference[0]
    stop = ref[12:15]
    want = text_of(run(collect(models.plain, greedy("p", TOKENS, prompt=models.prompts[0], stop=[stop]))))
    assert stop not in want and ref.startswith(want)
    for engine in _engines(models):
        outs = run(_batch(engine, [greedy("st", TOKENS, prompt=models.prompts[0], stop=[stop]),
                                   greedy("free", TOKENS, prompt=models.prompts[1])]))
        assert [text_of(o) for o in outs] == [want, models.reference[1]]
        assert outs[0][-1].finish_reason == "stop"


def test_a_grammar_rejects_the_drafts_it_forbids(models: Models) -> None:
    schema = {"type": "object", "properties": {"kind": {"enum": ["file", "folder", "link"]},
                                               "depth": {"enum": [1, 2, 3]}},
              "required": ["kind", "depth"], "additionalProperties": False}
    ask = greedy("g", 40, prompt=models.prompts[1], constraint=Constraint.json_schema(schema))
    want = text_of(run(collect(models.plain, ask)))
    assert want.startswith("{")
    for engine in _engines(models):
        outs = run(_batch(engine, [ask, greedy("free", TOKENS, prompt=models.prompts[3])]))
        assert [text_of(o) for o in outs] == [want, models.reference[3]]


def test_penalties_logit_bias_logprobs_and_seeded_sampling_match(models: Models) -> None:
    asks = [
        greedy("pen", TOKENS, prompt=models.prompts[0], logprobs=2, logit_bias={7: 2.0},
               sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3)),
        # A seeded draw is made once per emitted token, as without speculation.
        greedy("seed", TOKENS, prompt=models.prompts[2], sampling=SamplingParams(temperature=0.8, seed=11)),
    ]
    want = run(_batch(models.plain, asks))
    for engine in _engines(models):
        outs = run(_batch(engine, asks))
        assert [text_of(o) for o in outs] == [text_of(w) for w in want]
        got = [(e.token, e.logprob) for c in outs[0] for e in c.logprobs or ()]
        expected = [(e.token, e.logprob) for c in want[0] for e in c.logprobs or ()]
        assert [t for t, _ in got] == [t for t, _ in expected]
        # A verify pass computes the block's positions in one product, a plain
        # step one: float32 rounds them a few ulps apart.
        assert [lp for _, lp in got] == pytest.approx([lp for _, lp in expected], abs=1e-3)


def test_the_same_text_across_a_prefix_cache_hit(models: Models) -> None:
    engine = models.lookup
    ask = greedy("turn", TOKENS, messages=[{"role": "user", "content": models.prompts[3]}])
    want = text_of(run(collect(models.plain, ask)))
    first = run(collect(engine, ask))
    again = run(collect(engine, ask))
    assert text_of(first) == text_of(again) == want
    assert again[-1].cached_tokens > 0


@pytest.fixture(scope="module")
def contrary(worker: MlxWorker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TextEngine, TextEngine]]:
    """qwen3 drafted by its own weights with the final norm negated: the
    draft writes the target's least likely token, so every draft is rejected
    and each step pays K draft passes for nothing (a mix that loses)."""
    import shutil

    import mlx.core as mx

    from mlxd.factory.zoo_build import build_family

    path = build_family("qwen3")
    draft = tmp_path_factory.mktemp("contrary") / "qwen3-contrary"
    shutil.copytree(path, draft)
    weights = mx.load(str(draft / "model.safetensors"))
    weights["model.norm.weight"] = -weights["model.norm.weight"]
    mx.save_safetensors(str(draft / "model.safetensors"), weights, metadata={"format": "mlx"})
    engine = run(load_text_engine(spec_for(path, "contrary", max_concurrency=3,
                                           speculative=SpeculativeSpec("draft", 4, "neg", draft)), worker))
    plain = run(load_text_engine(spec_for(path, "plain", max_concurrency=3), worker))
    yield engine, plain
    run(engine.close())
    run(plain.close())


def test_status_shows_it_off_under_a_mix_where_it_loses(contrary: tuple[TextEngine, TextEngine]) -> None:
    engine, plain = contrary
    # Off, its plain steps run one ahead (the next forward queued before the
    # tokens are read); a row that ends first leaves while the others go on,
    # as a batch of two: a mix of its own, measured warm, which status shows.
    asks = [greedy("lose", 24, prompt=SEEDS[0]), greedy("long", 56, prompt=SEEDS[1]),
            greedy("longer", 56, prompt=SEEDS[2])]
    # The plain engine first: its steps compile the kernels both use, which
    # would otherwise make the first plain steps measured here slow.
    want = [text_of(o) for o in run(_batch(plain, asks))]
    outs = run(_batch(engine, asks))
    status = engine.stats()["speculative"]
    assert status["acceptance_rate"] is not None and status["acceptance_rate"] < 0.2, status
    assert status["active"] is False and status["speedup"] < 1.0, repr(status)
    assert [text_of(o) for o in outs] == want


@pytest.mark.parametrize("method, k", [("prompt_lookup", 8), ("draft", 8), ("prompt_lookup", 16)])
def test_long_drafts_are_byte_identical_in_a_batch(models: Models, worker: MlxWorker, method: str, k: int) -> None:
    """K = 8 and the registry's largest K (16): blocks of 9 and 17 positions,
    rows giving back anything from none to all of them in one step."""
    path = Path(models.plain.spec.path)
    spec = (SpeculativeSpec(method, k, "self", path, auto_off=False) if method == "draft"
            else SpeculativeSpec(method, k, auto_off=False))
    engine = run(load_text_engine(spec_for(path, f"k{k}", max_concurrency=4, speculative=spec), worker))
    try:
        assert engine.stats()["speculative"]["tokens"] == k
        outs = run(_batch(engine, [greedy(f"k{i}", TOKENS, prompt=p) for i, p in enumerate(models.prompts)]))
        assert [text_of(o) for o in outs] == models.reference
        status = engine.stats()["speculative"]
        assert status["drafted_tokens"] > 0, status
        if method == "draft":
            # Its own weights keep nearly every draft: steps emit more tokens
            # than a K = 4 block could (5), so the long blocks are used.
            assert status["accepted_per_step"] > 5, status
    finally:
        run(engine.close())


def test_sampled_rows_without_processors_draw_the_same_tokens_as_without_speculation(models: Models) -> None:
    """A batch whose rows have no logits processors decodes its plain steps
    one ahead, sampled rows included (they used to force every step of the
    batch to be read back first); a seeded row makes one draw a token there
    too, so it writes what the model without speculation writes, beside
    greedy rows and rows of another seed."""
    asks = [
        greedy("seed-a", TOKENS, prompt=models.prompts[0], sampling=SamplingParams(temperature=0.8, seed=3)),
        greedy("greedy", TOKENS, prompt=models.prompts[1]),
        greedy("seed-b", TOKENS, prompt=models.prompts[2], sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=5)),
        greedy("seed-c", TOKENS, prompt=models.prompts[3], sampling=SamplingParams(temperature=0.8, seed=3)),
    ]
    want = [text_of(w) for w in run(_batch(models.plain, asks))]
    assert want[0] != want[3] or models.prompts[0] == models.prompts[3]
    for engine in _engines(models):
        assert [text_of(o) for o in run(_batch(engine, asks))] == want
    # Unseeded rows of the same values share one sampler: one draw for the batch a step.
    shared = [greedy(f"s{i}", TOKENS, prompt=models.prompts[i], ignore_eos=True,
                     sampling=SamplingParams(temperature=0.8)) for i in range(4)]
    for engine in _engines(models):
        outs = run(_batch(engine, shared))
        assert [o[-1].completion_tokens for o in outs] == [TOKENS] * 4


def test_bulk_requests_joining_a_busy_speculative_batch_write_what_they_write_alone(models: Models) -> None:
    """A bulk request joining a batch that is decoding leaves its prompt's
    last token to the batch (engine/batch.py, _batch_draws_first): in a
    speculative batch that token is the row's first input, drafted from and
    verified like any other."""
    runner = greedy("runner", 4 * TOKENS, prompt=models.prompts[0], ignore_eos=True)
    bulk = [greedy(f"bulk{i}", TOKENS, prompt=models.prompts[i], priority="bulk") for i in (1, 2, 3)]

    async def main(engine: TextEngine) -> list[Any]:
        joined = None
        async for chunk in engine.generate(runner):
            if not is_acceptance(chunk) and joined is None:
                joined = asyncio.gather(*[collect(engine, r) for r in bulk])
        return await joined

    for engine in _engines(models):
        assert [text_of(o) for o in run(main(engine))] == models.reference[1:]
