"""Continuous batching in the text engine, on real tiny models.

Reference outputs come from the single path (``max_concurrency: 1``) over the
same weights. mlx-lm's batched decode (left-padded KV, masked attention, a
batched matmul) could in principle round differently from the single path;
on these models it gives the very same tokens — checked over chat and
completion prompts on qwen2 and llama, tiny and small, with and without
OpenBLAS — so the tests compare whole texts.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from engine.engine_support import CHAT, PROMPT, collect, greedy, is_acceptance, run, spec_for, text_of
from prefix_cache.cache_support import QUESTIONS, chat

from mlxd.engine.batch import BatchScheduler
from mlxd.engine.loader import load_text_engine
from mlxd.engine.types import GenerationChunk, GenerationRequest, SamplingParams
from mlxd.engine.worker import MlxWorker
from mlxd.errors import BadRequest, ShuttingDown

pytestmark = pytest.mark.mlx

# Different real prompts, chat and completion.
CHATS = [
    CHAT,
    [{"role": "user", "content": "List the files"}],
    [{"role": "user", "content": "Which function parses the command line arguments?"}],
    [{"role": "user", "content": "Explain how the logging handlers are configured"}],
]
COMPLETIONS = [
    PROMPT,
    "import os\nimport sys\n\ndef main():\n",
    "class Config:\n    def __init__(self, path):\n",
    "The daemon loads models on demand and",
]


def varied(i: int, **kwargs: Any) -> GenerationRequest:
    """The i-th of eight different prompts (even: chat, odd: completion)."""
    if "prompt" not in kwargs and "messages" not in kwargs:
        if i % 2:
            kwargs["prompt"] = COMPLETIONS[(i // 2) % 4]
        else:
            kwargs["messages"] = CHATS[(i // 2) % 4]
    return greedy(f"r{i}", **kwargs)


async def steps_pass(worker, n: int) -> None:
    """Until ``n`` more worker steps have started. The count goes up as a step
    starts, so once it is ``n`` past, the first ``n - 1`` of them are done.
    (Counting worker calls is not enough: two calls may run back to back.)"""
    target = worker.steps + n
    while worker.steps < target:
        await worker.call(lambda: None)


async def together(engine, requests: list[GenerationRequest]) -> list[list[GenerationChunk]]:
    return list(await asyncio.gather(*(collect(engine, r) for r in requests)))


async def one_by_one(engine, requests: list[GenerationRequest]) -> list[list[GenerationChunk]]:
    return [await collect(engine, r) for r in requests]


def test_eight_concurrent_requests_end_with_exactly_their_max_tokens(batched):
    lengths = [5, 40, 12, 33, 1, 27, 18, 9]
    requests = [varied(i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
    steps_before = batched.stats()["batched_steps"]
    results = run(together(batched, requests))
    for chunks, n in zip(results, lengths):
        assert chunks[-1].finish_reason == "length"
        assert chunks[-1].completion_tokens == n
        assert all(c.finish_reason is None for c in chunks[:-1])
    stats = batched.stats()
    # One decode step serves every sequence in the batch: far fewer steps than tokens.
    assert stats["batched_steps"] - steps_before < sum(lengths) // 2
    assert stats["tokens_generated"] == sum(lengths)
    assert (stats["running"], stats["in_flight"], stats["batch_size"]) == (0, 0, 0)


def test_greedy_text_in_a_batch_is_the_text_alone(batched, single):
    requests = [varied(i, max_tokens=20 + 3 * i) for i in range(8)]
    alone = run(one_by_one(single, requests))
    crowd = run(together(batched, requests))
    for solo, batch in zip(alone, crowd):
        assert text_of(batch) == text_of(solo)
        assert (batch[-1].finish_reason, batch[-1].completion_tokens, batch[-1].prompt_tokens) == (
            solo[-1].finish_reason, solo[-1].completion_tokens, solo[-1].prompt_tokens,
        )
    assert len({text_of(c) for c in crowd}) == len(crowd)  # really eight different answers


def test_penalties_apply_per_request_and_match_the_single_path(batched, single):
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1.5, presence_penalty=0.8)
    plain = SamplingParams(temperature=0)
    requests = [varied(i, max_tokens=40, sampling=penalised if i < 2 else plain) for i in range(4)]
    alone = run(one_by_one(single, requests))
    crowd = run(together(batched, requests))
    assert [text_of(c) for c in crowd] == [text_of(c) for c in alone]
    unpenalised = run(collect(single, varied(0, max_tokens=40)))
    assert text_of(unpenalised) != text_of(alone[0]), "the penalty changed nothing: the test proves nothing"


def test_a_seeded_request_samples_the_same_tokens_in_and_out_of_a_batch(batched, single):
    def sampled(i: int, seed: int | None) -> GenerationRequest:
        return varied(i, max_tokens=24, sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=seed))

    alone = text_of(run(collect(single, sampled(0, 7))))
    crowd = run(together(batched, [sampled(0, 7), sampled(1, None), sampled(2, None), sampled(0, 8)]))
    assert text_of(crowd[0]) == alone
    assert text_of(crowd[3]) != alone  # another seed, another answer


def test_stop_strings_are_per_request(batched, single):
    requests = [varied(i, max_tokens=32) for i in range(3)]
    full = [text_of(c) for c in run(one_by_one(single, requests))]
    stops = [full[0][len(full[0]) // 2 :][:3], full[1][len(full[1]) // 3 :][:4]]
    assert all(len(s) >= 3 for s in stops)
    crowd = run(together(batched, [
        varied(0, max_tokens=32, stop=[stops[0]]),
        varied(1, max_tokens=32, stop=["never appears", stops[1]]),
        varied(2, max_tokens=32),
    ]))
    for k in (0, 1):
        assert text_of(crowd[k]) == full[k][: full[k].find(stops[k])]
        assert (crowd[k][-1].finish_reason, crowd[k][-1].stop_sequence) == ("stop", stops[k])
        assert crowd[k][-1].completion_tokens < 32
    assert text_of(crowd[2]) == full[2]
    assert crowd[2][-1].stop_sequence is None


def test_ignore_eos_is_per_request(batched):
    messages = [{"role": "user", "content": "List the files"}]
    natural = run(collect(batched, greedy(max_tokens=600, messages=messages)))
    assert natural[-1].finish_reason == "stop"
    ended_at = natural[-1].completion_tokens
    crowd = run(together(batched, [
        greedy("natural", max_tokens=600, messages=messages),
        greedy("forced", max_tokens=ended_at + 20, messages=messages, ignore_eos=True),
    ]))
    assert (crowd[0][-1].finish_reason, crowd[0][-1].completion_tokens) == ("stop", ended_at)
    assert text_of(crowd[0]) == text_of(natural)
    assert (crowd[1][-1].finish_reason, crowd[1][-1].completion_tokens) == ("length", ended_at + 20)
    forced = text_of(crowd[1])
    assert forced.startswith(text_of(natural)) and len(forced) > len(text_of(natural))
    assert "<|im_end|>" not in forced


def test_closing_one_stream_removes_only_that_sequence(batched, worker):
    requests = [varied(i, max_tokens=150, ignore_eos=True) for i in range(3)]
    expected = [text_of(c) for c in run(one_by_one(batched, requests[1:]))]

    async def main():
        others = [asyncio.create_task(collect(batched, r)) for r in requests[1:]]
        victim = batched.generate(requests[0])
        got = 0
        async for _ in victim:
            got += 1
            if got == 3:
                break
        await victim.aclose()
        sizes = [batched.stats()["batch_size"]]
        # The step running now may have passed its check; the next one drops it.
        await steps_pass(worker, 2)
        sizes.append(batched.stats()["batch_size"])
        still_running = not any(t.done() for t in others)
        return sizes, still_running, await asyncio.gather(*others)

    generated_before = batched.stats()["tokens_generated"]
    sizes, still_running, results = run(main())
    assert sizes == [3, 2] and still_running
    assert [text_of(c) for c in results] == expected
    assert all(c[-1].completion_tokens == 150 and c[-1].finish_reason == "length" for c in results)
    stats = batched.stats()
    assert stats["tokens_generated"] - generated_before < 3 * 150
    assert (stats["in_flight"], stats["running"], stats["aborted"]) == (0, 0, 0)


def test_a_request_arriving_mid_flight_joins_the_running_batch(batched, single):
    first, second = varied(0, max_tokens=300, ignore_eos=True), varied(1, max_tokens=20)
    expected = [text_of(c) for c in run(one_by_one(single, [first, second]))]

    async def main():
        sizes, chunks, joined = [], [], None
        async for chunk in batched.generate(first):
            if is_acceptance(chunk):
                continue  # yielded before the request reaches the batch
            chunks.append(chunk)
            sizes.append(batched.stats()["batch_size"])
            if len(chunks) == 5:
                joined = asyncio.create_task(collect(batched, second))
        assert joined is not None
        return sizes, chunks, await joined

    sizes, chunks, late = run(main())
    assert sizes[0] == 1 and max(sizes) == 2  # joined while the first was still decoding
    assert [text_of(chunks), text_of(late)] == expected


def test_abort_all_ends_every_sequence_with_abort_and_the_batch_goes_on(batched, worker):
    async def main():
        tasks = [asyncio.create_task(collect(batched, varied(i, max_tokens=400, ignore_eos=True))) for i in range(3)]
        while batched.stats()["batch_size"] < 3:
            await worker.call(lambda: None)
        aborted = await batched.abort_all("preempted")
        return aborted, await asyncio.gather(*tasks)

    aborted, results = run(main())
    assert aborted == 3
    for chunks in results:
        assert chunks[-1].finish_reason == "abort"
        assert chunks[-1].completion_tokens < 100
    stats = batched.stats()
    assert (stats["aborted"], stats["in_flight"], stats["running"], stats["batch_size"]) == (3, 0, 0, 0)
    # A new request starts a new batch loop.
    assert run(collect(batched, varied(0, max_tokens=6, ignore_eos=True)))[-1].completion_tokens == 6


def test_close_while_a_batch_runs_aborts_it_and_frees_the_model(worker, qwen_tiny):
    from mlxd.engine import memory

    async def main():
        await worker.call(memory.release_memory)
        baseline = await worker.call(memory.active_bytes)
        engine = await load_text_engine(spec_for(qwen_tiny, "closing", max_concurrency=4), worker)
        tasks = [asyncio.create_task(collect(engine, varied(i, max_tokens=2000, ignore_eos=True))) for i in range(3)]
        while engine.stats()["batch_size"] < 3:
            await worker.call(lambda: None)
        await engine.close()
        results = await asyncio.gather(*tasks)
        after = await worker.call(memory.active_bytes)
        return engine, results, after - baseline

    engine, results, leftover = run(main())
    assert [c[-1].finish_reason for c in results] == ["abort"] * 3
    assert leftover < engine.load_bytes * 0.05
    assert engine.stats()["closed"] and engine.stats()["running"] == 0


def test_prefix_cache_hits_in_batched_mode_give_the_same_answer(batched, single):
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1.3)
    first = greedy("a", max_tokens=12, messages=chat(QUESTIONS[0]))
    other = greedy("b", max_tokens=12, messages=chat(QUESTIONS[1]), sampling=penalised)
    cold = [text_of(c) for c in run(one_by_one(single, [first, other]))]

    opened = run(together(batched, [first, other]))
    assert [text_of(c) for c in opened] == cold
    assert [c[-1].cached_tokens for c in opened] == [0, 0]
    # The same two again, side by side: both start from the cache.
    again = run(together(batched, [first, other]))
    assert [text_of(c) for c in again] == cold
    for chunks in again:
        assert 100 < chunks[-1].cached_tokens < chunks[-1].prompt_tokens
    # The next turn of the first conversation reuses its prompt and reply.
    follow = chat(QUESTIONS[0]) + [
        {"role": "assistant", "content": cold[0]},
        {"role": "user", "content": QUESTIONS[2]},
    ]
    turn = run(collect(batched, greedy("c", max_tokens=12, messages=follow)))
    assert turn[-1].cached_tokens > again[0][-1].prompt_tokens
    assert text_of(turn) == text_of(run(collect(single, greedy("c", max_tokens=12, messages=follow))))
    assert batched.stats()["prefix_cache"]["hits"] >= 3


def test_a_bad_request_fails_alone(worker, qwen_tiny):
    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "ctx", max_context=40, max_concurrency=4), worker)
        try:
            prompt_len = len(await worker.call(engine.model.prompt_tokens, varied(0)))
            good = [asyncio.create_task(collect(engine, varied(0, max_tokens=100))) for _ in range(2)]
            with pytest.raises(BadRequest) as err:
                await collect(engine, varied(1, prompt=PROMPT * 8))
            return prompt_len, err.value, await asyncio.gather(*good)
        finally:
            await engine.close()

    prompt_len, error, results = run(main())
    assert error.code == "context_length_exceeded"
    for chunks in results:
        # max_tokens is capped by max_context - prompt, as on the single path.
        assert (chunks[-1].finish_reason, chunks[-1].completion_tokens) == ("length", 40 - prompt_len)


def test_a_long_prompt_is_prefilled_in_chunks_between_other_streams(worker, qwen_tiny, llama_tiny):
    """Another model's stream keeps producing while a long prompt is prefilled."""
    import keyword

    names = [w for w in keyword.kwlist if w.isalpha()]
    long_prompt = " ".join(f"{names[i % len(names)]}_{i}" for i in range(400))

    async def main():
        batch = await load_text_engine(spec_for(qwen_tiny, "b", max_concurrency=4), worker, prefill_chunk=16)
        other = await load_text_engine(spec_for(llama_tiny, "o"), worker)
        try:
            n_prompt = len(await worker.call(batch.model.prompt_tokens, greedy(prompt=long_prompt)))
            arrivals: list[str] = []

            async def consume(engine, request):
                async for chunk in engine.generate(request):
                    if not is_acceptance(chunk):
                        arrivals.append(engine.name)

            await asyncio.gather(
                consume(batch, greedy("long", prompt=long_prompt, max_tokens=2)),
                consume(other, greedy("o", max_tokens=300, ignore_eos=True, prompt=PROMPT)),
            )
            return n_prompt, arrivals
        finally:
            await batch.close()
            await other.close()

    n_prompt, arrivals = run(main())
    assert n_prompt > 16 * 20
    # The other model emitted many tokens before the long prompt's first one:
    # the prefill (n_prompt / 16 turns) did not hold the worker in one go.
    assert arrivals.index("b") > n_prompt // 16 // 2


@pytest.mark.parametrize(
    ("overrides", "batching"),
    [({"max_concurrency": 1}, False), ({"max_concurrency": 4, "kv_bits": 8}, False), ({"max_concurrency": 2}, True)],
)
def test_which_engines_batch_and_the_others_still_serve_concurrent_requests(worker, qwen_small, overrides, batching):
    async def main():
        engine = await load_text_engine(spec_for(qwen_small, "m", **overrides), worker)
        try:
            stats = engine.stats()["batching"]
            return stats, await together(engine, [varied(i, max_tokens=4, ignore_eos=True) for i in range(2)])
        finally:
            await engine.close()

    batches, results = run(main())
    assert batches is batching
    assert [c[-1].completion_tokens for c in results] == [4, 4]


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_worker_shutdown_ends_running_streams_and_refused_ones_leave_no_trace(qwen_tiny, concurrency):
    worker = MlxWorker().start()  # its own: this test shuts it down

    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "m", max_concurrency=concurrency), worker)
        running = asyncio.create_task(collect(engine, varied(0, max_tokens=3000, ignore_eos=True)))
        while engine.stats()["running"] == 0:
            await worker.call(lambda: None)
        await worker.shutdown()
        with pytest.raises(ShuttingDown):
            await running
        # Starting a stream on a stopped worker fails; the request must not
        # stay registered as in flight.
        with pytest.raises(ShuttingDown):
            await collect(engine, varied(1))
        stats = engine.stats()
        await engine.close()
        return stats

    stats = run(main())
    assert stats["in_flight"] == 0
    assert stats["batching"] is (concurrency > 1)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_close_never_releases_the_model_under_a_generation_caught_mid_step(worker, qwen_tiny, concurrency):
    """close() must not trust the running count while the worker is inside a
    step: here the first step is held right after its abort check."""
    entered, resume = threading.Event(), threading.Event()
    running_at_release: list[int] = []

    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "m", max_concurrency=concurrency), worker)
        real_model, real_release = engine.model.get, engine._release

        worker_thread = worker._thread

        def held() -> Any:  # worker thread, first step of the generation
            # The prompt is tokenized on a thread of its own first, which
            # reads the model too: hold only the worker's step.
            if threading.current_thread() is worker_thread and not entered.is_set():
                entered.set()
                resume.wait(30)
            return real_model()

        def release() -> Any:  # worker thread
            running_at_release.append(engine.counts.running)
            return real_release()

        engine.model.get = held  # type: ignore[method-assign]
        engine._release = release  # type: ignore[method-assign]
        task = asyncio.create_task(collect(engine, varied(0, max_tokens=50, ignore_eos=True)))
        await asyncio.to_thread(entered.wait, 30)
        closing = asyncio.create_task(engine.close())
        for _ in range(3):  # let close() run up to its first wait
            await asyncio.sleep(0)
        resume.set()
        await closing
        return await task

    chunks = run(main())
    assert chunks[-1].finish_reason == "abort"
    assert running_at_release == [0]


def test_a_request_whose_batch_loop_never_ran_is_told_the_worker_shut_down(qwen_tiny):
    """The worker stops with the batch loop's stream still queued (never
    stepped): nothing on the worker can answer the request any more, so the
    waiting consumer notices the worker is gone by itself."""
    worker = MlxWorker().start()  # its own: this test shuts it down
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(30)

    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "m", max_concurrency=4), worker)
        holding = asyncio.create_task(worker.call(hold))
        await asyncio.to_thread(started.wait, 30)
        request = asyncio.create_task(collect(engine, varied(0, max_tokens=8)))
        await asyncio.sleep(0)  # the request is submitted: the batch loop's stream is queued
        stopping = asyncio.create_task(worker.shutdown())
        await asyncio.sleep(0)  # the worker is told to stop before it gets to that stream
        release.set()
        await holding
        await stopping
        with pytest.raises(ShuttingDown):
            await asyncio.wait_for(request, 30)
        await engine.close()
        return engine.stats()

    stats = run(main())
    assert (stats["in_flight"], stats["running"], stats["generations"]) == (0, 0, 0)


def test_prompts_wait_for_prefill_by_class_first_come_first_served_within_one():
    from mlxd.engine.batch import prefill_position

    interactive, default, bulk = 0, 1, 2
    assert prefill_position([bulk, bulk], interactive) == 0, "ahead of the bulk prompts queued before it"
    assert prefill_position([interactive, bulk], interactive) == 1, "behind an interactive one that came first"
    assert prefill_position([interactive, default, bulk], default) == 2
    assert prefill_position([interactive], bulk) == 1 and prefill_position([], bulk) == 0


def test_an_interactive_prompt_is_prefilled_before_the_long_bulk_prompts_queued_ahead_of_it(worker, qwen_tiny):
    """Two long bulk prompts (many prefill chunks each) and a short
    interactive one arrive together: the interactive request's first token
    comes first, and the bulk prompts' prefill goes on after it."""
    import keyword

    names = [w for w in keyword.kwlist if w.isalpha()]
    long_prompt = " ".join(f"{names[i % len(names)]}_{i}" for i in range(60))

    async def main():
        batch = await load_text_engine(spec_for(qwen_tiny, "b", max_concurrency=4), worker, prefill_chunk=8)
        try:
            firsts: list[str] = []

            async def consume(request):
                async for chunk in batch.generate(request):
                    if not is_acceptance(chunk) and request.request_id not in firsts:
                        firsts.append(request.request_id)

            gate = threading.Event()
            held = asyncio.ensure_future(worker.call(gate.wait))  # the worker busy while all three arrive
            asks = [greedy(f"bulk{i}", prompt=f"{long_prompt} {i}", max_tokens=2, priority="bulk") for i in range(2)]
            asks.append(greedy("editor", prompt=PROMPT, max_tokens=2, priority="interactive"))
            consumers = [asyncio.ensure_future(consume(r)) for r in asks]
            await asyncio.sleep(0.2)
            gate.set()
            await held
            await asyncio.gather(*consumers)
            return firsts
        finally:
            await batch.close()

    assert run(main()) == ["editor", "bulk0", "bulk1"]


@pytest.mark.parametrize("max_tokens", [1, 6])
def test_the_first_token_comes_from_the_prefill_not_from_batched_steps(batched, single, max_tokens):
    """A request's first token is drawn where its prompt is prefilled, as on
    the single path, and handed out before the batch's next step: mlx-lm's
    batch gave it out two steps after the request joined, and on a busy batch
    each of those steps decodes every other row first. So a one-token answer
    takes no batched step; a longer one takes one per token, since the batch
    computes a step ahead and its first step only feeds the prefill's token."""
    request = varied(2, max_tokens=max_tokens, ignore_eos=True)
    expected = text_of(run(collect(single, request)))
    before = batched.stats()["batched_steps"]
    chunks = run(collect(batched, request))
    assert text_of(chunks) == expected
    assert chunks[-1].completion_tokens == max_tokens
    steps = batched.stats()["batched_steps"] - before
    assert steps == (0 if max_tokens == 1 else max_tokens)


@pytest.mark.parametrize("max_tokens", [2, 6])
def test_a_first_token_without_text_is_followed_on_its_own_until_text_comes(batched, single, max_tokens):
    """A first token may give no text yet (a byte of a longer character, or
    the start of one of the request's stop strings): the request draws its
    next token on its own before joining, so that its first text does not
    wait for the batch's step after the join, a busy batch's slowest. Here
    the first token's text begins a stop string, which holds it back: a
    two-token answer then takes no batched step at all (it took one), a
    six-token one five (six before), and the text is the single path's."""
    plain = varied(2, max_tokens=max_tokens, ignore_eos=True)
    first = run(collect(single, varied(2, max_tokens=1, ignore_eos=True)))
    assert text_of(first), "the first token of this prompt has text of its own"
    request = varied(2, max_tokens=max_tokens, ignore_eos=True, stop=[text_of(first) + "\u0000never"])
    expected = run(collect(single, request))
    assert text_of(expected) == text_of(run(collect(single, plain)))
    before = batched.stats()["batched_steps"]
    chunks = run(collect(batched, request))
    assert text_of(chunks) == text_of(expected)
    assert chunks[0].completion_tokens == 2, "the held-back text came out with the second token"
    assert batched.stats()["batched_steps"] - before == (0 if max_tokens == 2 else max_tokens - 1)


@pytest.mark.parametrize("max_tokens", [1, 2, 30])
def test_bulk_requests_joining_a_decoding_batch_let_it_draw_their_first_token_and_answer_as_alone(
        batched, single, max_tokens, monkeypatch):
    """Bulk requests that join a batch already decoding leave their prompt's
    last token to the batch, which draws their first token in its step (one
    forward for all the joiners: engine/batch.py, _batch_draws_first). Their
    answers are the single path's, to the token count, penalties included
    (the batch sees the whole prompt as their context); a request of another
    class joining beside them still gets its first token before the step."""
    penalised = SamplingParams(temperature=0.0, repetition_penalty=1.5, presence_penalty=0.8)
    runner = varied(0, max_tokens=200, ignore_eos=True)
    bulk = [varied(i, max_tokens=max_tokens, priority="bulk", ignore_eos=True,
                   **({"sampling": penalised} if i == 2 else {})) for i in (1, 2, 3)]
    other = varied(5, max_tokens=max_tokens, ignore_eos=True)
    expected = [text_of(c) for c in run(one_by_one(single, [*bulk, other]))]

    # The batch's step count when each request's first token was handed out,
    # read there: read where the consumer got it, a loaded machine's event
    # loop let the batch take another step first.
    first_step: dict[str, int] = {}
    post = BatchScheduler._post

    def posted(self, seq, item):
        if isinstance(item, GenerationChunk) and not is_acceptance(item):
            first_step.setdefault(seq.request.request_id, self.steps)
        post(self, seq, item)

    monkeypatch.setattr(BatchScheduler, "_post", posted)

    async def answer(request):
        """Its chunks, and the batch's step count when its first token came."""
        chunks = [chunk async for chunk in batched.generate(request) if not is_acceptance(chunk)]
        return chunks, first_step[request.request_id]

    async def main():
        joined = None
        async for chunk in batched.generate(runner):
            if not is_acceptance(chunk) and joined is None:
                # The runner decodes: the others join a busy batch, together.
                joined = asyncio.gather(*(answer(r) for r in [*bulk, other]))
        return await joined

    results = run(main())
    answers = [chunks for chunks, _ in results]
    assert [text_of(c) for c in answers] == expected
    assert all(c[-1].completion_tokens == max_tokens for c in answers)
    # The other class's first token went out before the batch's step, the bulk ones' after it.
    *bulk_steps, other_step = [step for _, step in results]
    assert all(step > other_step for step in bulk_steps)


def test_at_debug_level_a_first_text_held_up_by_the_worker_is_logged_with_the_wait(batched, single, worker, caplog):
    """The slow-turn and slow-first-text logs (engine/turn_clock.py) run only
    at debug level, so only there could they break a batch. Twelve requests
    of three classes arriving together answer as on the single path (bulk
    ones joining a decoding batch among them); then one arrives while the worker
    is held for 0.3 s, and its line says it waited for the worker that long."""
    requests = [varied(i, max_tokens=4, ignore_eos=True, priority=p)
                for i, p in enumerate(["interactive", "default", "bulk", "bulk"] * 3)]
    expected = [text_of(c) for c in run(one_by_one(single, requests))]

    async def held_up():
        gate = threading.Event()
        held = asyncio.ensure_future(worker.call(gate.wait))
        answer = asyncio.ensure_future(collect(batched, requests[0]))
        await asyncio.sleep(0.3)
        gate.set()
        await held
        return await answer

    async def together():
        return await asyncio.gather(*(collect(batched, r) for r in requests))

    with caplog.at_level("DEBUG", logger="mlxd.engine.batch"):
        assert [text_of(c) for c in run(together())] == expected
        assert text_of(run(held_up())) == expected[0]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    waits = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"slow first text .*, interactive: waited for the turn ([0-9.]+)", r.getMessage()))]
    assert any(wait >= 290 for wait in waits), waits


def test_a_decoding_batch_tells_the_pace_keeper_its_steady_steps(batched, worker):
    """What encoder passes beside it are held to (engine/generation_pace.py)."""
    before = worker.pace.snapshot(0.0)["periods"]
    run(collect(batched, varied(0, max_tokens=24, ignore_eos=True)))
    # A step's period is measured from the step before: the first of a run, and the
    # one that took the request in, are not.
    assert worker.pace.snapshot(0.0)["periods"] - before >= 24 - 3


def test_a_single_stream_tells_the_pace_keeper_its_steady_steps_too(single, worker):
    before = worker.pace.snapshot(0.0)["periods"]
    run(collect(single, varied(0, max_tokens=24, ignore_eos=True)))
    assert worker.pace.snapshot(0.0)["periods"] - before >= 24 - 3
