"""Between-turn prefill on real engines (``mlxd.engine.next_turn_background``):
the zoo's tiny Mistral Small 3.1 (its template writes the tool list before
the last user message) reuses >= 95 % of turn 2 after it and answers as a
cold prefill does; a user request that arrives during it pushes it aside
and both end with the right output; Qwen3 (exact reuse works already) does
no background prefill under ``auto``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from prefix_cache.cache_support import SYSTEM, ask, greedy, open_engine, run, spec_for
from zoo.zoo_support import zoo_model

from mlxd.engine.text import TextEngine
from mlxd.registry.model import PrefixCacheSpec

pytestmark = pytest.mark.mlx

TOOLS = [{"type": "function", "function": {
    "name": name, "description": text,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "pattern": {"type": "string"}},
                   "required": ["path"]}}}
    for name, text in (
        ("read_file", "Read a file of the project and return its text, line by line, with line numbers."),
        ("grep", "Search the project's files for a regular expression and list the matching lines."),
        ("list_dir", "List the files and folders under a folder of the project, with their sizes."),
        ("run_tests", "Run the project's test suite, or the tests under a path, and report the failures."),
    )]
FIRST = "Read the configuration file and report the options"
SECOND = "Which function parses the command line arguments?"


def spec(family: str, next_turn: Any = "auto", **overrides: Any) -> Any:
    overrides.setdefault("name", family)
    s = spec_for(zoo_model(family), max_context=8192, **overrides)
    return replace(s, prefix_cache=PrefixCacheSpec(64 << 20, 0, persist=False, next_turn=next_turn))


def turn(answers: list[str]) -> Any:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    for text, question in zip(answers, (SECOND,)):
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": question}]
    return greedy(max_tokens=12, messages=messages, tools=TOOLS)


async def conversation(engine: TextEngine) -> tuple[str, Any, Any, str]:
    """Turn 1, its between-turn prefill, turn 2: turn 1's text and last
    chunk, turn 2's last chunk and text."""
    first, first_last = await ask(engine, turn([]))
    await engine.next_turn.wait()
    second, last = await ask(engine, turn([first]))
    return first, first_last, last, second


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_mistral3_turn_2_reuses_the_tools_and_answers_as_cold(worker, batched):
    async def go() -> None:
        engine = await open_engine(worker, spec("mistral3", max_concurrency=4 if batched else 1))
        try:
            first, first_last, last, second = await conversation(engine)
            stats = engine.stats()
            # The new message's known part, and the whole next prompt were it to repeat FIRST.
            assert stats["prefix_cache"]["next_turn_prefills"] == 2
            assert stats["prefix_cache"]["next_turn_tokens"] > 0
            assert last.cached_tokens >= 0.95 * last.prompt_tokens, (last.cached_tokens, last.prompt_tokens)
            # Its tokens are not the requests': counted are turn 2's lookup and the two prompts.
            assert stats["prefix_cache"]["tokens_reused"] == last.cached_tokens
            assert stats["prompt_tokens"] == first_last.prompt_tokens + last.prompt_tokens
            assert await engine.clear_prefix_cache()
            cold, cold_last = await ask(engine, turn([first]))
            assert cold_last.cached_tokens == 0
            assert second == cold
        finally:
            await engine.close()

    run(go())


def test_mistral3_a_repeated_message_finds_its_whole_prompt(worker):
    """Mistral's template writes the tools before every user message equal
    to the last: a next turn that repeats one moves them again, to a place
    the new message's known part does not have; that prompt is prefilled too."""

    async def go() -> None:
        engine = await open_engine(worker, spec("mistral3"))
        try:
            first, _ = await ask(engine, turn([]))
            await engine.next_turn.wait()
            again = turn([first])
            again.messages[-1] = {"role": "user", "content": FIRST}
            text, last = await ask(engine, again)
            assert last.cached_tokens == last.prompt_tokens - 1
            assert await engine.clear_prefix_cache()
            assert (await ask(engine, again))[0] == text
        finally:
            await engine.close()

    run(go())


def test_qwen3_under_auto_prefills_nothing_between_turns(worker):
    async def go() -> None:
        engine = await open_engine(worker, spec("qwen3"))
        try:
            _, _, last, _ = await conversation(engine)
            stats = engine.stats()["prefix_cache"]
            assert stats["next_turn_prefills"] == 0 and stats["next_turn_tokens"] == 0
            assert last.cached_tokens >= 0.95 * last.prompt_tokens
        finally:
            await engine.close()

    run(go())


def test_false_turns_it_off(worker):
    async def go() -> None:
        engine = await open_engine(worker, spec("mistral3", next_turn=False))
        try:
            _, _, last, _ = await conversation(engine)
            assert engine.stats()["prefix_cache"]["next_turn_prefills"] == 0
            assert last.cached_tokens < 0.9 * last.prompt_tokens
        finally:
            await engine.close()

    run(go())


def test_a_user_request_pushes_the_prefill_aside_and_both_end_right(worker):
    """One-token chunks make the prefill hundreds of steps long: a request
    sent while it runs ends it at its next step, and what it did is kept."""

    async def go() -> None:
        reference = await open_engine(worker, spec("mistral3", next_turn=False, name="cold"),
                                      prefill_chunk=512)
        try:
            first, _ = await ask(reference, turn([]))
            other = greedy(max_tokens=12, messages=[{"role": "user", "content": SECOND}])
            cold_other, _ = await ask(reference, other)
            cold_second, _ = await ask(reference, turn([first]))
        finally:
            await reference.close()
        engine = await open_engine(worker, spec("mistral3"), prefill_chunk=1)
        try:
            assert (await ask(engine, turn([])))[0] == first
            while not engine.next_turn.running:
                await asyncio.sleep(0.001)
            text, _ = await ask(engine, other)
            assert text == cold_other
            await engine.next_turn.wait()
            stats = engine.stats()["prefix_cache"]
            # Pushed aside part way, its tokens so far kept as an entry.
            assert stats["next_turn_prefills"] == 1
            second, last = await ask(engine, turn([first]))
            assert second == cold_second
            assert 0 < stats["next_turn_tokens"] < last.prompt_tokens - 1000
        finally:
            await engine.close()

    run(go())


def test_closing_the_engine_during_the_prefill_stops_it_and_frees_the_model(worker):
    async def go() -> None:
        engine = await open_engine(worker, spec("mistral3"), prefill_chunk=1)
        await ask(engine, turn([]))
        while not engine.next_turn.running:
            await asyncio.sleep(0.001)
        await asyncio.wait_for(engine.close(), 60)
        assert not engine.next_turn.running and engine.prefix_cache.entries == 0
        await engine.next_turn.wait()

    run(go())


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_an_answer_under_way_during_a_clear_prefills_no_next_turn(worker, batched):
    """A clear while an answer decodes empties the cache of that answer too;
    its end must not prefill the cleared conversation back in either: the
    same prompt asked next reuses nothing."""
    async def go() -> None:
        engine = await open_engine(worker, spec("qwen3", next_turn=True, max_concurrency=4 if batched else 1))
        try:
            request = replace(turn([]), max_tokens=40, ignore_eos=True, tools=None)
            chunks = 0
            async for _ in engine.generate(request):
                chunks += 1
                if chunks == 5:  # decoding: its lookup is done
                    await engine.clear_prefix_cache()
            await engine.next_turn.wait()
            _, last = await ask(engine, replace(request, max_tokens=2))
            assert last.cached_tokens == 0
            assert engine.stats()["prefix_cache"]["next_turn_prefills"] == 0
        finally:
            await engine.close()

    run(go())
