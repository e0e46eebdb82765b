"""The in-memory prefix cache on real tiny models: the same greedy output
cold or warm, what is reused and reported, and what is never kept."""

from __future__ import annotations

import asyncio

import pytest
from prefix_cache.cache_support import (
    QUESTIONS,
    SYSTEM,
    ask,
    chat,
    greedy,
    open_engine,
    prefix_stats,
    run,
    spec_for,
)

from mlxd.engine.prefix_cache import PrefixCache
from mlxd.engine.types import SamplingParams

pytestmark = pytest.mark.mlx


async def _cold_texts(worker, path, requests, **spec):
    """Reference outputs from an engine without a prefix cache."""
    engine = await open_engine(worker, spec_for(path, max_bytes=0, **spec))
    try:
        return [(await ask(engine, r))[0] for r in requests]
    finally:
        await engine.close()


@pytest.mark.parametrize("model", ["qwen_tiny", "llama_tiny"])
def test_warm_output_is_the_cold_output_and_reports_cached_tokens(worker, model, request):
    path = request.getfixturevalue(model)
    first, other = greedy(messages=chat(QUESTIONS[0])), greedy(messages=chat(QUESTIONS[1]))
    completion = greedy(prompt=SYSTEM + "\ndef parse_arguments(argv):\n")

    async def main():
        cold = await _cold_texts(worker, path, [first, other, completion])
        engine = await open_engine(worker, spec_for(path))  # chunks of 64: the chunked prefill runs
        try:
            text, last = await ask(engine, first)
            assert (text, last.cached_tokens) == (cold[0], 0)
            text, again = await ask(engine, first)
            assert text == cold[0]
            assert 0 < again.cached_tokens < again.prompt_tokens
            # Another question after the same system prompt reuses the system prompt.
            text, shared = await ask(engine, other)
            assert text == cold[1]
            assert 100 < shared.cached_tokens < shared.prompt_tokens
            text, _ = await ask(engine, completion)
            text, warm = await ask(engine, completion)
            assert text == cold[2] and warm.cached_tokens > 0
            stats = prefix_stats(engine)
            assert stats["hits"] == 2 + 1 and stats["misses"] == 2
            assert stats["tokens_reused"] == again.cached_tokens + shared.cached_tokens + warm.cached_tokens
        finally:
            await engine.close()

    run(main())


def test_the_reply_is_cached_with_the_prompt_for_the_next_turn(worker, qwen_tiny):
    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny))
        try:
            messages = chat(QUESTIONS[0])
            reply, first = await ask(engine, greedy(messages=messages))
            kept = await worker.call(engine.prefix_cache.snapshot)
            assert [len(s.tokens) for s in kept] == [first.prompt_tokens + first.completion_tokens]
            follow_up = [*messages, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
            _, second = await ask(engine, greedy(messages=follow_up))
            assert second.cached_tokens > first.prompt_tokens
        finally:
            await engine.close()

    run(main())


def test_penalties_see_the_same_look_back_warm_as_cold(worker, qwen_tiny):
    base = SYSTEM + QUESTIONS[1]
    sampling = SamplingParams(temperature=0.0, repetition_penalty=1.5)

    async def main():
        # A prompt ending in the model's own favourite tokens: the penalty on
        # the prompt's tail then decides the output.
        (echo,) = await _cold_texts(worker, qwen_tiny, [greedy(max_tokens=24, prompt=base)])
        req = greedy(max_tokens=24, prompt=base + echo, sampling=sampling)
        (cold,) = await _cold_texts(worker, qwen_tiny, [req])
        engine = await open_engine(worker, spec_for(qwen_tiny))
        try:
            await ask(engine, req)
            text, last = await ask(engine, req)
        finally:
            await engine.close()
        assert text == cold
        # mlx-lm's penalties look back over tokens stream_generate processed.
        assert 0 < last.cached_tokens <= last.prompt_tokens - 32

    run(main())


def test_an_aborted_prefill_or_a_closed_stream_keeps_nothing(worker, qwen_tiny):
    long_prompt = greedy(messages=chat(QUESTIONS[3], system=SYSTEM * 2))

    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny), prefill_chunk=16)
        try:
            steps = worker.steps
            task = asyncio.ensure_future(ask(engine, long_prompt))
            # Abort once the chunked prefill is under way.
            while worker.steps < steps + 3 and not task.done():
                await asyncio.sleep(0.001)
            assert await engine.abort_all("test") == 1
            _, last = await task
            assert last.finish_reason == "abort"
            # A consumer that leaves after the first chunk.
            stream = engine.generate(long_prompt)
            async for _chunk in stream:
                break
            await stream.aclose()
            await worker.call(lambda: None)  # the close is queued before this call
            assert prefix_stats(engine)["memory_entries"] == 0
            _, fresh = await ask(engine, long_prompt)
            assert fresh.cached_tokens == 0 and fresh.finish_reason in ("stop", "length")
            assert prefix_stats(engine)["memory_entries"] == 1
        finally:
            await engine.close()

    run(main())


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_an_answer_ending_after_a_clear_keeps_nothing(worker, qwen_tiny, batched):
    """A clear empties the cache for good: a request that looked it up
    before the clear and ends after it does not put its conversation back."""
    request = greedy(max_tokens=48, messages=chat(QUESTIONS[0]))

    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny, max_concurrency=4 if batched else 1))
        try:
            stream = engine.generate(request)
            async for chunk in stream:
                if chunk.text:  # decoding: looked up, prefilled, checkpoints kept
                    break
            assert await engine.clear_prefix_cache()
            last = [c async for c in stream][-1]
            assert last.finish_reason == "length", "it went on generating after the clear"
            assert prefix_stats(engine)["memory_entries"] == 0
            # One that starts after the clear keeps its entry, as always.
            await ask(engine, request)
            assert prefix_stats(engine)["memory_entries"] >= 1
        finally:
            await engine.close()

    run(main())


def test_a_between_turn_prefill_cut_by_a_clear_keeps_and_counts_nothing(worker, qwen_tiny):
    """Status counts the between-turn prefills that kept an entry: one a
    clear came into the middle of kept nothing the next turn can use, and
    was counted all the same (next_turn_prefills 2 for one kept)."""
    from mlxd.engine.lifecycle import GenerationControl

    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny))
        try:
            await ask(engine, greedy(max_tokens=2, messages=chat(QUESTIONS[0])))
            tokens = [(7 * i) % 500 + 10 for i in range(700)]  # two chunks of 512
            prefill = engine.next_turn._prefill([tokens], GenerationControl(request_id="next"))
            await worker.call(next, prefill)  # the first chunk fed
            await worker.call(engine.prefix_cache.clear)
            await worker.call(list, prefill)  # the rest, then what it keeps
            assert prefix_stats(engine)["memory_entries"] == 0
            assert engine.next_turn.prefills == 0 and engine.next_turn.tokens == 0
        finally:
            await engine.close()

    run(main())


def test_memory_stays_within_max_bytes_least_recently_used_first(worker, qwen_tiny):
    prompts = [greedy(messages=chat(q, system=f"Session {i}. " + SYSTEM)) for i, q in enumerate(QUESTIONS)]

    async def main():
        probe = await open_engine(worker, spec_for(qwen_tiny))
        await ask(probe, prompts[0])
        one_entry = prefix_stats(probe)["memory_bytes"]
        await probe.close()

        budget = int(one_entry * 2.5)
        engine = await open_engine(worker, spec_for(qwen_tiny, max_bytes=budget))
        try:
            for p in prompts:
                await ask(engine, p)
            stats = prefix_stats(engine)
            assert stats["memory_entries"] == 2 and 0 < stats["memory_bytes"] <= budget
            assert (await ask(engine, prompts[-1]))[1].cached_tokens > 0
            # The oldest is gone: only the first token of the chat template is shared.
            assert (await ask(engine, prompts[0]))[1].cached_tokens < 10
        finally:
            await engine.close()
        # An entry larger than the whole budget is not kept and evicts nothing.
        tight = await open_engine(worker, spec_for(qwen_tiny, max_bytes=one_entry // 2))
        try:
            await ask(tight, prompts[0])
            assert prefix_stats(tight)["memory_entries"] == 0
        finally:
            await tight.close()

    run(main())


def test_stats_carry_every_documented_key(worker, qwen_tiny):
    async def main():
        engine = await open_engine(worker, spec_for(qwen_tiny))
        try:
            await ask(engine, greedy(messages=chat(QUESTIONS[0])))
            return prefix_stats(engine)
        finally:
            await engine.close()

    stats = run(main())
    for key in ("memory_entries", "memory_bytes", "disk_entries", "disk_bytes", "hits", "misses", "tokens_reused",
                "restored_entries", "last_save_seconds", "last_restore_seconds"):
        assert key in stats
    assert stats["memory_entries"] == 1 and stats["memory_bytes"] > 0 and stats["misses"] == 1


# ----------------------------------------------------- PrefixCache alone
def _kv(tokens: int, layers: int = 2, step_padding: bool = True):
    """A KVCache list as a model leaves it: values tell positions apart."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    cache = []
    for layer in range(layers):
        c = KVCache()
        x = mx.arange(tokens * 8, dtype=mx.float32).reshape(1, 1, tokens, 8) + layer
        c.update_and_fetch(x, -x)
        cache.append(c)
    return cache


def test_lookup_leaves_tokens_to_prefill_and_entries_are_compacted(worker):
    def scenario():
        cache = PrefixCache(max_bytes=1 << 20)
        tokens = list(range(100, 140))
        cache.insert(tokens + [7, 8], _kv(42))
        # KVCache allocates 256 positions; the kept entry holds exactly 42.
        assert cache.nbytes == 2 * 2 * 42 * 8 * 4
        hit, reused = cache.fetch(tokens + [7, 8])  # exact: one token left to run
        assert reused == 41 and hit[0].offset == 41
        _, reused = cache.fetch(tokens + [7, 8], keep=32)
        assert reused == 10
        _, reused = cache.fetch(tokens + [9])  # diverges after 40 tokens: trimmed copy
        assert reused == 40
        assert cache.fetch([1, 2, 3]) == (None, 0)
        # A key longer than the KV it came with is cut to the KV length.
        cache.insert(list(range(500, 530)), _kv(20))
        assert sorted(len(s.tokens) for s in cache.snapshot()) == [20, 42]
        # A stored entry is never changed by a request that used it.
        assert cache.snapshot()[-1].cache[0].offset == 42
        return cache.hits, cache.misses

    assert run(worker.call(scenario)) == (3, 1)


def test_a_short_prefix_of_a_long_entry_is_copied_alone_and_continues_as_cold(worker, qwen_tiny):
    """A prompt that shares only its start with a long entry (a system
    prompt, a conversation's first turns) gets a copy of that start and room
    for the next positions, not of the whole entry (which its first update
    then copied whole), and the model goes on from it as from a cold prefill
    of the same tokens. Reusing most of an entry shares it as before."""
    def scenario():
        import mlx.core as mx
        from mlx_lm import load
        from mlx_lm.models.cache import make_prompt_cache

        model, _ = load(str(qwen_tiny))
        long = [(i * 7) % 500 + 10 for i in range(1200)]
        full = make_prompt_cache(model)
        for start in range(0, len(long), 400):
            model(mx.array(long[start:start + 400])[None], cache=full)
        cache = PrefixCache(max_bytes=1 << 30)
        cache.insert(long, full)
        prompt = long[:100] + [3, 4, 5]
        hit, reused = cache.fetch(prompt)
        assert reused == 100 and hit[0].offset == 100
        assert hit[0].keys.shape[2] == 100 + 256, "the start and room for the next positions, not 1,200"
        warm = model(mx.array(prompt[reused:])[None], cache=hit)
        cold = model(mx.array(prompt)[None], cache=make_prompt_cache(model))[:, reused:]
        assert mx.allclose(warm, cold, atol=1e-4).item()
        most, reused = cache.fetch(long[:1100] + [3])
        assert reused == 1100 and most[0].keys.shape[2] == 1200
        return cache.snapshot()[0].cache[0].offset

    assert run(worker.call(scenario)) == 1200, "the entry itself is untouched"
