"""The mlx-lm text engine against real tiny models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine.engine_support import CHAT, PROMPT, collect, greedy, run, spec_for, text_of

from mlxd.engine.loader import load_text_engine
from mlxd.engine.types import GenerationRequest, SamplingParams
from mlxd.errors import BadRequest, ServiceUnavailable

pytestmark = pytest.mark.mlx


def direct_mlx_lm(worker, path, prompt: str | list[dict[str, Any]], max_tokens: int) -> str:
    """What plain mlx-lm produces greedily for the same input (run on the worker too)."""

    def generate() -> str:
        import mlx_lm

        model, tokenizer = mlx_lm.load(str(path))
        if isinstance(prompt, list):
            tokens = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
        else:
            tokens = tokenizer.encode(prompt)
        return mlx_lm.generate(model, tokenizer, tokens, max_tokens=max_tokens)

    return run(worker.call(generate))


def test_greedy_chat_is_deterministic_and_matches_plain_mlx_lm(engine, worker, qwen_tiny):
    first = run(collect(engine, greedy("a")))
    second = run(collect(engine, greedy("b")))
    assert text_of(first) == text_of(second)
    assert text_of(first) == direct_mlx_lm(worker, qwen_tiny, CHAT, 24)
    assert len(text_of(first)) > 10


def test_completion_encodes_the_raw_prompt(engine, worker, qwen_tiny):
    chunks = run(collect(engine, greedy(prompt=PROMPT, max_tokens=16)))
    assert text_of(chunks) == direct_mlx_lm(worker, qwen_tiny, PROMPT, 16)
    assert chunks[-1].prompt_tokens == len(run(worker.call(engine.model.prompt_tokens, greedy(prompt=PROMPT))))


def test_max_tokens_ends_with_length_after_exactly_that_many_tokens(engine, worker):
    chunks = run(collect(engine, greedy(max_tokens=7)))
    final = chunks[-1]
    assert final.finish_reason == "length"
    assert final.completion_tokens == 7
    assert final.prompt_tokens == len(run(worker.call(engine.model.prompt_tokens, greedy())))
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert all(c.prompt_tokens == final.prompt_tokens for c in chunks)
    counts = [c.completion_tokens for c in chunks]
    assert counts == sorted(counts)


def test_text_parts_are_flattened_like_a_plain_string(engine):
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Read the configuration file "},
                {"type": "text", "text": "and report the options"},
            ],
        }
    ]
    assert text_of(run(collect(engine, greedy(messages=parts)))) == text_of(
        run(collect(engine, greedy()))
    )


def test_an_image_part_sent_to_a_text_model_is_a_bad_request(engine):
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(BadRequest) as err:
        run(collect(engine, greedy(messages=image)))
    assert err.value.param == "messages"
    assert "image_url" in err.value.message


def test_stop_string_from_the_middle_cuts_the_output_before_it(engine):
    full = text_of(run(collect(engine, greedy(max_tokens=32))))
    middle = len(full) // 2
    stop = full[middle : middle + 3]
    chunks = run(collect(engine, greedy(max_tokens=32, stop=["never appears", stop])))
    assert text_of(chunks) == full[: full.find(stop)]
    assert (chunks[-1].finish_reason, chunks[-1].stop_sequence) == ("stop", stop)
    assert chunks[-1].completion_tokens < 32
    # Ended by max_tokens, it names no stop string.
    short = run(collect(engine, greedy(max_tokens=2, stop=["never appears"])))
    assert (short[-1].finish_reason, short[-1].stop_sequence) == ("length", None)


def test_stop_string_spanning_two_tokens_is_caught(engine):
    chunks = run(collect(engine, greedy(max_tokens=32)))
    full = text_of(chunks)
    offsets = [0]
    for c in chunks:
        offsets.append(offsets[-1] + len(c.text))
    # A stop made of the end of one token's text and the start of the next,
    # whose first occurrence in the output is exactly at that boundary.
    stop = None
    for i in range(len(chunks) - 2):
        left, right = chunks[i].text, chunks[i + 1].text
        if len(left) >= 2 and len(right) >= 2:
            candidate = left[-2:] + right[:2]
            if full.find(candidate) == offsets[i + 1] - 2:
                stop = candidate
                break
    assert stop is not None, "the model's output has no two adjacent multi-character tokens"
    cut = run(collect(engine, greedy(max_tokens=32, stop=["never appears", stop])))
    assert text_of(cut) == full[: full.find(stop)]
    assert cut[-1].finish_reason == "stop"


def test_closing_the_stream_early_stops_generation(engine, worker):
    async def main():
        stream = engine.generate(greedy(max_tokens=2000))
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        await stream.aclose()
        await worker.call(lambda: None)
        steps = worker.steps
        await worker.call(lambda: None)
        await worker.call(lambda: None)
        return steps

    steps = run(main())
    assert worker.steps == steps
    stats = engine.stats()
    assert stats["running"] == 0
    assert stats["in_flight"] == 0
    assert stats["tokens_generated"] < 20


def test_two_models_decode_interleaved(worker, qwen_tiny, llama_tiny):
    async def main():
        qwen = await load_text_engine(spec_for(qwen_tiny, "qwen"), worker)
        llama = await load_text_engine(spec_for(llama_tiny, "llama"), worker)
        arrivals: list[tuple[str, str | None]] = []

        async def consume(engine):
            async for chunk in engine.generate(greedy(engine.name, max_tokens=40, prompt=PROMPT)):
                arrivals.append((engine.name, chunk.finish_reason))

        try:
            await asyncio.gather(consume(qwen), consume(llama))
        finally:
            await qwen.close()
            await llama.close()
        return arrivals

    arrivals = run(main())
    first_final = min(i for i, (_, finish) in enumerate(arrivals) if finish)
    before = {name for name, _ in arrivals[:first_final]}
    assert before == {"qwen", "llama"}, "one model finished before the other started"
    # Token by token, not one whole generation then the other.
    switches = sum(1 for a, b in zip(arrivals, arrivals[1:]) if a[0] != b[0])
    assert switches >= 10


def test_abort_all_ends_a_running_stream_with_abort(engine):
    async def main():
        chunks = []
        aborted = None
        async for chunk in engine.generate(greedy(max_tokens=2000)):
            chunks.append(chunk)
            if len(chunks) == 2:
                aborted = await engine.abort_all("preempted")
        return chunks, aborted

    chunks, aborted = run(main())
    assert aborted == 1
    assert chunks[-1].finish_reason == "abort"
    assert chunks[-1].completion_tokens < 20
    assert engine.stats()["aborted"] == 1
    assert engine.stats()["in_flight"] == 0


@pytest.mark.parametrize("field", ["messages", "prompt"])
def test_prompt_longer_than_max_context_is_a_bad_request(worker, qwen_tiny, field):
    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "short", max_context=8), worker)
        try:
            request = greedy(**({"prompt": PROMPT} if field == "prompt" else {}))
            await collect(engine, request)
        finally:
            await engine.close()

    with pytest.raises(BadRequest) as err:
        run(main())
    assert err.value.param == field
    assert "8 tokens" in err.value.message
    assert "prompt has" in err.value.message


def test_decoding_stops_at_max_context(worker, qwen_tiny):
    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny, "ctx", max_context=30), worker)
        try:
            prompt_len = len(await worker.call(engine.model.prompt_tokens, greedy()))
            return prompt_len, await collect(engine, greedy(max_tokens=100))
        finally:
            await engine.close()

    prompt_len, chunks = run(main())
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].completion_tokens == 30 - prompt_len


def test_same_seed_same_tokens_even_alongside_another_request(engine):
    def sampled(seed: int | None) -> GenerationRequest:
        return greedy(
            f"s{seed}", max_tokens=24, sampling=SamplingParams(temperature=1.0, seed=seed)
        )

    alone = text_of(run(collect(engine, sampled(7))))

    async def concurrent():
        return await asyncio.gather(collect(engine, sampled(7)), collect(engine, sampled(None)))

    together, _ = run(concurrent())
    assert text_of(together) == alone
    assert text_of(run(collect(engine, sampled(8)))) != alone


def test_load_measures_the_footprint_and_the_first_generation_peak(engine):
    assert engine.load_bytes > 1_000_000  # the tiny model's weights are ~2 MB
    # The warm-up before `loaded` was the first generation: its peak is known.
    assert engine.peak_bytes is not None
    run(collect(engine, greedy()))
    assert engine.measured_bytes >= engine.load_bytes
    assert engine.stats()["measured_bytes"] == engine.measured_bytes


def test_close_releases_the_model_memory_and_is_idempotent(worker, qwen_tiny):
    from mlxd.engine import memory

    async def main():
        await worker.call(memory.release_memory)
        baseline = await worker.call(memory.active_bytes)
        engine = await load_text_engine(spec_for(qwen_tiny), worker)
        await collect(engine, greedy())
        loaded = await worker.call(memory.active_bytes)
        await engine.close()
        await engine.close()
        after = await worker.call(memory.active_bytes)
        with pytest.raises(ServiceUnavailable):
            await collect(engine, greedy())
        return baseline, loaded, after, engine.load_bytes

    baseline, loaded, after, load_bytes = run(main())
    assert loaded - baseline >= load_bytes
    assert after - baseline < load_bytes * 0.05


def test_streamed_text_never_splits_a_character(worker, qwen_tiny):
    """The detokenizer the engine streams through holds back partial UTF-8."""

    def pieces() -> tuple[list[str], str, int]:
        import mlx_lm

        _, tokenizer = mlx_lm.load(str(qwen_tiny))
        text = "naïve café — “quoted” 日本語 😀 done"
        tokens = tokenizer.encode(text, add_special_tokens=False)
        single = [tokenizer.decode([t]) for t in tokens]
        detok = tokenizer.detokenizer
        out = []
        for t in tokens:
            detok.add_token(t)
            out.append(detok.last_segment)
        detok.finalize()
        out.append(detok.last_segment)
        return out, text, sum("\ufffd" in s for s in single)

    out, text, split_tokens = run(worker.call(pieces))
    assert split_tokens > 0, "no character of the sample spans two tokens"
    assert "".join(out) == text
    assert not any("\ufffd" in piece for piece in out)


def long_prompt(words: int) -> str:
    import keyword

    names = [w for w in keyword.kwlist if w.isalpha()]
    return " ".join(f"{names[i % len(names)]}_{i}" for i in range(words))


def test_chunked_prefill_gives_the_same_tokens_as_mlx_lm(worker, qwen_tiny):
    prompt = long_prompt(60)

    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny), worker, prefill_chunk=16)
        try:
            n_prompt = len(await worker.call(engine.model.prompt_tokens, greedy(prompt=prompt)))
            steps = worker.steps
            chunks = await collect(engine, greedy(prompt=prompt, max_tokens=16))
            return n_prompt, worker.steps - steps, chunks
        finally:
            await engine.close()

    n_prompt, steps, chunks = run(main())
    assert n_prompt > 16 * 4
    assert steps > n_prompt // 16 - 2  # the prefill really was split into worker steps
    assert text_of(chunks) == direct_mlx_lm(worker, qwen_tiny, prompt, 16)


def test_abort_during_a_long_prefill_ends_before_any_token(worker, qwen_tiny):
    prompt = long_prompt(600)

    async def main():
        engine = await load_text_engine(spec_for(qwen_tiny), worker, prefill_chunk=1)
        try:
            task = asyncio.create_task(collect(engine, greedy(prompt=prompt, max_tokens=8)))
            while engine.stats()["running"] == 0:
                await worker.call(lambda: None)
            aborted = await engine.abort_all("shutdown")
            return aborted, await task
        finally:
            await engine.close()

    aborted, chunks = run(main())
    assert aborted == 1
    assert [c.finish_reason for c in chunks] == ["abort"]
    assert chunks[0].completion_tokens == 0


def test_close_during_a_generation_aborts_it_and_frees_the_model(worker, qwen_tiny):
    from mlxd.engine import memory

    async def main():
        await worker.call(memory.release_memory)
        baseline = await worker.call(memory.active_bytes)
        engine = await load_text_engine(spec_for(qwen_tiny), worker)
        chunks = []
        async for chunk in engine.generate(greedy(max_tokens=2000)):
            chunks.append(chunk)
            if len(chunks) == 2:
                closing = asyncio.create_task(engine.close())
        await closing
        return chunks, baseline, await worker.call(memory.active_bytes), engine.load_bytes

    chunks, baseline, after, load_bytes = run(main())
    assert chunks[-1].finish_reason == "abort"
    assert after - baseline < load_bytes * 0.05


def test_ignore_eos_decodes_past_the_end_token_to_max_tokens(engine):
    messages = [{"role": "user", "content": "List the files"}]
    natural = run(collect(engine, greedy(max_tokens=600, messages=messages)))
    assert natural[-1].finish_reason == "stop"
    ended_at = natural[-1].completion_tokens
    assert ended_at < 600
    forced = run(collect(engine, greedy(max_tokens=ended_at + 20, messages=messages, ignore_eos=True)))
    assert forced[-1].finish_reason == "length"
    assert forced[-1].completion_tokens == ended_at + 20
    assert "<|im_end|>" not in text_of(forced)
