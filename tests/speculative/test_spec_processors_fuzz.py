"""A seeded differential fuzz of the speculative batch's logits processors,
through the engine: random mixes of requests (greedy, seeded and unseeded
temperature; repetition, presence and frequency penalties, logit_bias,
ignore_eos, a stop string, logprobs, different max_tokens; rows that join a
running batch and leave it at different times) run on a speculative engine
and on the same model without ``speculative:``. Every greedy and seeded
request must write the same text, tokens and finish, and its logprobs must
match.

The penalties, logit_bias and ignore_eos read a row's tokens on the device,
so the speculative batch runs such rows one plain step ahead, the
processors applied to tokens still on their way (``_processed``); drafts
send the batch through the verify path (``_verify``/``_draw``), which shows
them the history on the host. Prompt lookup and the model as its own draft,
with the governor free to turn speculation off (auto_off) and not, make both
kinds of step and the moves between them. A grammar reads the host: a batch
with one must never compute a step ahead, and still write the same bytes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from engine.engine_support import collect, greedy, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.text import TextEngine
from mlxd.engine.types import Constraint, GenerationChunk, GenerationRequest, SamplingParams
from mlxd.engine.worker import MlxWorker
from mlxd.registry.model import SpeculativeSpec

pytestmark = pytest.mark.mlx

SEEDS = [0, 1, 2, 3, 4, 5]
# Dense, hybrid (state layers replayed after a verify step), sliding window,
# and a thinking hybrid: its chat template opens a reasoning block, counted
# from the tokens written, or shaped by a budget (a processor on the host).
FAMILIES = ["qwen3", "qwen3_next", "gemma3_text", "qwen3_5"]
# Repeated text, so that prompt lookup finds drafts and keeps some.
PROMPTS = [
    "import os\nimport sys\nfor name in os.listdir(path):\n    print(name)\nfor name in os.listdir(path):\n",
    "The license grants permission to copy the software. The license grants permission to",
    "def parse(argv):\n    parser = argparse.ArgumentParser()\n    return parser\ndef parse(argv):\n",
    "red green blue red green blue red green",
]
STOPS = ["e", "\n", "s", "in"]
VOCAB = 1024  # the zoo's
SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["file", "folder", "link"]}, "depth": {"enum": [1, 2, 3]}},
          "required": ["kind", "depth"], "additionalProperties": False}


@dataclass
class Engines:
    family: str
    plain: TextEngine
    speculative: list[TextEngine]
    # PROMPTS, each with the model's own greedy answer and the prompt again:
    # what it writes then repeats what it read, and prompt lookup drafts it.
    prompts: list[str]


@pytest.fixture(scope="module")
def worker() -> Iterator[MlxWorker]:
    w = MlxWorker().start()
    yield w
    run(w.shutdown())


@pytest.fixture(scope="module", params=FAMILIES)
def engines(request: pytest.FixtureRequest, worker: MlxWorker) -> Iterator[Engines]:
    from mlxd.factory.zoo_build import build_family

    path: Path = build_family(request.param)
    specs = {
        "lookup": SpeculativeSpec("prompt_lookup", 3, auto_off=False),
        "lookup-auto": SpeculativeSpec("prompt_lookup", 3, auto_off=True),
        "draft": SpeculativeSpec("draft", 3, "self", path, auto_off=False),
        "draft-auto": SpeculativeSpec("draft", 3, "self", path, auto_off=True),
    }

    async def load() -> Engines:
        plain = await load_text_engine(spec_for(path, "plain", max_concurrency=4), worker)
        speculative = [await load_text_engine(spec_for(path, name, max_concurrency=4, speculative=spec), worker)
                       for name, spec in specs.items()]
        answers = [await collect(plain, greedy("a", 24, prompt=p)) for p in PROMPTS]
        return Engines(request.param, plain, speculative, [p + text_of(a) + "\n" + p for p, a in zip(PROMPTS, answers)])

    loaded = run(load())
    yield loaded
    for engine in (loaded.plain, *loaded.speculative):
        run(engine.close())


@dataclass
class Ask:
    request: GenerationRequest
    # Starts once request ``after`` has written ``chunks`` chunks (or ended); None: at once.
    after: int | None
    chunks: int
    # Its consumer goes away after this many chunks with text (None: reads to the end).
    cancel: int | None = None

    @property
    def comparable(self) -> bool:
        """Greedy or seeded: the same tokens whatever else runs beside it."""
        s = self.request.sampling
        return s.temperature == 0 or s.seed is not None


def _ask(rng: random.Random, prompts: list[str], i: int, started: int) -> Ask:
    kind = rng.choice(["greedy", "greedy", "seeded", "unseeded"])
    sampling: dict[str, Any] = {"temperature": 0.0}
    if kind != "greedy":
        sampling = {"temperature": rng.choice([0.7, 1.0]), "top_p": rng.choice([1.0, 0.9]),
                    "min_p": rng.choice([0.0, 0.0, 0.05]), "top_k": rng.choice([0, 0, 40])}
        if kind == "seeded":
            sampling["seed"] = rng.randrange(1000)
    if rng.random() < 0.4:
        sampling["repetition_penalty"] = rng.choice([1.1, 1.3, 1.6])
    if rng.random() < 0.35:
        sampling["presence_penalty"] = rng.choice([0.3, 0.8])
    if rng.random() < 0.35:
        sampling["frequency_penalty"] = rng.choice([0.2, 0.6])
    extra: dict[str, Any] = {}
    if rng.random() < 0.35:
        extra["logit_bias"] = {rng.randrange(VOCAB): rng.choice([-4.0, 2.0, 5.0]) for _ in range(rng.randint(1, 3))}
    if rng.random() < 0.3:
        extra["stop"] = [rng.choice(STOPS)]
    prompt = rng.choice(prompts)
    if rng.random() < 0.2:
        # A chat turn: a thinking family's template opens a reasoning block;
        # a budget on it is a processor that reads the host.
        extra["messages"] = [{"role": "user", "content": prompt}]
        if rng.random() < 0.5:
            extra["reasoning_budget"] = rng.randint(2, 12)
    else:
        extra["prompt"] = prompt
    if rng.random() < 0.1:
        # A grammar reads the host: the batch verifies every step while it is in.
        extra["constraint"] = Constraint.json_schema(SCHEMA)
    if rng.random() < 0.2:
        # Joining a busy batch, a bulk request's first token is drawn in the batch's step.
        extra["priority"] = "bulk"
    after = rng.randrange(started) if i >= started else None
    return Ask(
        greedy(f"r{i}", rng.choice([1, 2, rng.randint(3, 36), rng.randint(3, 36)]),
               sampling=SamplingParams(**sampling), ignore_eos=rng.random() < 0.3,
               logprobs=rng.choice([None, None, 0, 2]), **extra),
        after, rng.randint(1, 6), rng.randint(1, 8) if rng.random() < 0.15 else None,
    )


def _mix(seed: int, prompts: list[str]) -> list[Ask]:
    rng = random.Random(seed)
    count = rng.randint(3, 6)
    started = rng.randint(1, min(3, count))
    return [_ask(rng, prompts, i, started) for i in range(count)]


async def _run(engine: TextEngine, asks: list[Ask]) -> list[list[GenerationChunk]]:
    """Every ask, each started when the one it waits for has written enough."""
    progress = [asyncio.Event() for _ in asks]
    outs: list[list[GenerationChunk]] = [[] for _ in asks]

    async def one(i: int, ask: Ask) -> None:
        if ask.after is not None:
            await progress[ask.after].wait()
        written = 0
        stream = engine.generate(ask.request)
        async for chunk in stream:
            outs[i].append(chunk)
            written += bool(chunk.text)
            if written >= ask.chunks:
                progress[i].set()
            if ask.cancel is not None and written >= ask.cancel:
                break
        await stream.aclose()
        progress[i].set()

    await asyncio.gather(*(one(i, a) for i, a in enumerate(asks)))
    return outs


def _written(chunks: list[GenerationChunk]) -> dict[str, Any]:
    last = chunks[-1]
    return {"text": text_of(chunks), "finish": last.finish_reason, "tokens": last.completion_tokens,
            "stop": last.stop_sequence, "reasoning": last.reasoning_tokens,
            "logprobs": [e.token for c in chunks for e in c.logprobs or ()]}


def _mismatches(asks: list[Ask], want: list[list[GenerationChunk]],
                got: list[list[GenerationChunk]]) -> list[str]:
    found = []
    for ask, w, g in zip(asks, want, got):
        name = ask.request.request_id
        if ask.cancel is not None:
            # What it read before it went away was written as without speculation.
            if ask.comparable and not text_of(w).startswith(text_of(g)):
                found.append(f"{name}: cancelled after {text_of(g)!r}, not a start of {text_of(w)!r}")
            continue
        if not ask.comparable:
            # An unseeded draw is not reproducible; its length is, without an end or a stop.
            if ask.request.ignore_eos and not ask.request.stop and g[-1].completion_tokens != ask.request.max_tokens:
                found.append(f"{name}: {g[-1].completion_tokens} tokens, not {ask.request.max_tokens}")
            continue
        if _written(w) != _written(g):
            found.append(f"{name}: {_written(g)} != {_written(w)}")
            continue
        if ask.request.logprobs is not None:
            # A verify pass computes a block's positions in one product, a
            # plain step one: float32 rounds them a few ulps apart.
            lw = [e.logprob for c in w for e in c.logprobs or ()]
            lg = [e.logprob for c in g for e in c.logprobs or ()]
            # NaN where nothing was allowed: a grammar that ended, with ignore_eos.
            if lg != pytest.approx(lw, abs=1e-3, nan_ok=True):
                found.append(f"{name}: logprobs {lg} != {lw}")
            tw = [[t for t, _, _ in e.top] for c in w for e in c.logprobs or ()]
            tg = [[t for t, _, _ in e.top] for c in g for e in c.logprobs or ()]
            if len(tw) != len(tg):
                found.append(f"{name}: top logprobs {tg} != {tw}")
    return found


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often rows' processors ran on a step computed ahead, and on drafts being verified."""
    from mlxd.engine.speculative_batch import SpeculativeGenerator

    counts = {"ahead": 0, "verified": 0}
    processed, draw = SpeculativeGenerator._processed, SpeculativeGenerator._draw

    def ahead(self: SpeculativeGenerator, logits: Any, inputs: Any) -> Any:
        counts["ahead"] += 1
        return processed(self, logits, inputs)

    def verified(self: SpeculativeGenerator, row: Any, logits: Any) -> Any:
        counts["verified"] += bool(row.processors and row.drafts)
        return draw(self, row, logits)

    monkeypatch.setattr(SpeculativeGenerator, "_processed", ahead)
    monkeypatch.setattr(SpeculativeGenerator, "_draw", verified)
    return counts


def test_random_mixes_with_processors_write_what_plain_decoding_writes(engines: Engines,
                                                                       steps: dict[str, int]) -> None:
    before = [e.stats()["speculative"] for e in engines.speculative]
    failures = {}
    for seed in SEEDS:
        asks = _mix(seed, engines.prompts)
        want = run(_run(engines.plain, asks))
        for engine in engines.speculative:
            found = _mismatches(asks, want, run(_run(engine, asks)))
            if found:
                failures[(seed, engine.spec.name)] = [repr(a) for a in asks] + found
    assert not failures, failures
    # Drafts were verified: both kinds of step ran.
    for engine, was in zip(engines.speculative, before):
        now = engine.stats()["speculative"]
        if not engine.spec.speculative.auto_off:
            assert now["drafted_tokens"] > was["drafted_tokens"], (engine.spec.name, now)
    # Processors ran on both paths.
    assert steps["ahead"] > 0 and steps["verified"] > 0, steps


def test_a_grammar_beside_penalties_keeps_the_batch_from_running_ahead(engines: Engines,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A grammar reads each row's last token on the host: while its row is in
    the batch no step is computed ahead, and every row writes what plain
    decoding writes; the rows with penalties go on (ahead) once it ended."""
    from mlxd.engine.speculative_batch import SpeculativeGenerator

    ahead_with_grammar = []
    forward = SpeculativeGenerator._forward_ahead

    def watched(self: SpeculativeGenerator, inputs: Any) -> Any:
        ahead_with_grammar.append(any(r.history is None for r in self._rows))
        return forward(self, inputs)

    monkeypatch.setattr(SpeculativeGenerator, "_forward_ahead", watched)
    asks = [
        Ask(greedy("g", 30, prompt=engines.prompts[1], constraint=Constraint.json_schema(SCHEMA),
                   sampling=SamplingParams(temperature=0.0, repetition_penalty=1.2)), None, 0),
        Ask(greedy("pen", 40, prompt=engines.prompts[0], ignore_eos=True, logprobs=1, logit_bias={7: 3.0},
                   sampling=SamplingParams(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.3)),
            None, 0),
        Ask(greedy("seed", 40, prompt=engines.prompts[2],
                   sampling=SamplingParams(temperature=0.9, seed=4, presence_penalty=0.5)), None, 0),
    ]
    want = run(_run(engines.plain, asks))
    assert text_of(want[0]).startswith("{")
    assert want[0][-1].completion_tokens < asks[1].request.max_tokens  # the others go on without it
    ran_ahead = 0
    for engine in engines.speculative:
        ahead_with_grammar.clear()
        found = _mismatches(asks, want, run(_run(engine, asks)))
        assert not found, (engine.spec.name, found)
        assert not any(ahead_with_grammar), engine.spec.name
        ran_ahead += len(ahead_with_grammar)
    assert ran_ahead > 0
