"""The prefix cache on every kind of cache mlx-lm makes: a four-turn agent
conversation reuses the prompt on turns 2+, and every warm, batched,
restored and restarted answer is the cold one.

One tiny model per cache kind (prefix_cache/families.py): qwen3 (KVCache),
gemma3_text (RotatingKVCache + KVCache), qwen3_next (ArraysCache + KVCache),
gpt_oss (RotatingKVCache + KVCache, sinks), deepseek_v3 (MLA's latent in a
KVCache), falcon_h1 (CacheList of ArraysCache and KVCache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefix_cache.cache_support import SYSTEM, ask, greedy, open_engine, prefix_stats, run, spec_for, unload
from prefix_cache.families import FAMILIES, WINDOW, build_family

QUESTIONS = (
    "Read the configuration file and report the options",
    "Which function parses the command line arguments?",
    "Explain how the logging handlers are configured",
    "List the files that define the HTTP routes",
)
LONG_SYSTEM = SYSTEM * 2  # ~1,000 tokens: far past the sliding window


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> tuple[str, Path]:
    return request.param, build_family(request.param)


def _turn(answers: list[str], i: int) -> list[dict[str, str]]:
    """Turn ``i``'s request: the history (each earlier question and its
    answer from ``answers``) and question ``i``."""
    messages = [{"role": "system", "content": LONG_SYSTEM}]
    for j in range(i):
        messages += [{"role": "user", "content": QUESTIONS[j]}, {"role": "assistant", "content": answers[j]}]
    return messages + [{"role": "user", "content": QUESTIONS[i]}]


async def _conversation(engine, answers: list[str] | None = None) -> list[tuple[str, int, int]]:
    """(answer, prompt tokens, cached tokens) per turn; with ``answers``,
    the history holds those (so a warm run asks exactly what the cold one did)."""
    rows: list[tuple[str, int, int]] = []
    for i in range(len(QUESTIONS)):
        history = answers if answers is not None else [r[0] for r in rows]
        text, last = await ask(engine, greedy(max_tokens=12, messages=_turn(history, i)))
        rows.append((text, last.prompt_tokens, last.cached_tokens))
    return rows


async def _cold_conversation(worker, path: Path) -> list[tuple[str, int, int]]:
    """The conversation with the prefix cache off: the answers every other run must give."""
    cold = await open_engine(worker, spec_for(path, max_bytes=0))
    try:
        return await _conversation(cold)
    finally:
        await cold.close()


def test_every_cache_kind_reuses_turns_2_on_and_answers_as_cold(worker, family, tmp_path):
    name, path = family

    async def main():
        cold_rows = await _cold_conversation(worker, path)
        answers = [r[0] for r in cold_rows]
        results = {}
        for label, concurrency in (("single", 1), ("batched", 2)):
            engine = await open_engine(worker, spec_for(path, max_concurrency=concurrency), tmp_path / label)
            try:
                results[label] = await _conversation(engine, answers)
                stats = prefix_stats(engine)
            finally:
                await unload(engine)
            results[label + " stats"] = stats
        # After an unload: a new engine restores the saved entries from disk.
        engine = await open_engine(worker, spec_for(path), tmp_path / "single")
        try:
            restored = prefix_stats(engine)["restored_entries"]
            text, last = await ask(engine, greedy(max_tokens=12, messages=_turn(answers, len(QUESTIONS) - 1)))
        finally:
            await engine.close()
        return cold_rows, results, restored, (text, last.prompt_tokens, last.cached_tokens)

    cold_rows, results, restored, after_unload = run(main())
    for label in ("single", "batched"):
        rows = results[label]
        assert [r[0] for r in rows] == [r[0] for r in cold_rows], f"{name} {label}: warm answers differ from cold"
        assert rows[0][2] == 0
        for text, prompt, cached in rows[1:]:
            assert cached / prompt >= 0.95, f"{name} {label}: {cached}/{prompt} cached"
        assert results[label + " stats"]["memory_bytes"] <= results[label + " stats"]["max_bytes"]
    assert restored > 0
    assert after_unload[0] == cold_rows[-1][0]
    assert after_unload[2] / after_unload[1] >= 0.95, f"{name} after unload: {after_unload}"


_RESTART = """
import asyncio, json, os, sys
sys.path.insert(0, {tests!r})
from prefix_cache.cache_support import ask, greedy, open_engine, spec_for
from mlxd.engine.worker import MlxWorker

async def main():
    worker = MlxWorker().start()
    engine = await open_engine(worker, spec_for({path!r}), {cache!r})
    try:
        restored = engine.stats()["prefix_cache"]["restored_entries"]
        text, last = await ask(engine, greedy(max_tokens=12, messages=json.loads({messages!r})))
        print(json.dumps([text, last.prompt_tokens, last.cached_tokens, restored]), flush=True)
    finally:
        await engine.close()
        await worker.shutdown()

asyncio.run(main())
# Skip interpreter teardown: MLX's own threads sometimes abort it (seen with
# falcon_h1), after everything this test looks at is done.
os._exit(0)
"""


@pytest.mark.parametrize("name", ["gemma3_text", "qwen3_next", "falcon_h1"])
def test_a_restarted_process_restores_checkpoints_and_answers_as_cold(worker, name, tmp_path):
    path = build_family(name)

    async def first_process_part():
        rows = await _cold_conversation(worker, path)
        engine = await open_engine(worker, spec_for(path), tmp_path)
        try:
            await _conversation(engine, [r[0] for r in rows])
        finally:
            await unload(engine)
        return [r[0] for r in rows]

    answers = run(first_process_part())
    script = _RESTART.format(tests=str(Path(__file__).resolve().parent.parent), path=str(path), cache=str(tmp_path),
                             messages=json.dumps(_turn(answers, len(QUESTIONS) - 1)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    text, prompt, cached, restored = json.loads(done.stdout.strip().splitlines()[-1])
    assert restored > 0 and text == answers[-1]
    assert cached / prompt >= 0.95, (cached, prompt)


@pytest.mark.parametrize("name", ["gemma3_text", "gpt_oss", "qwen3_next", "falcon_h1"])
def test_a_checkpoint_continued_past_the_window_is_a_fresh_prefill(worker, name):
    """Restored from memory or from its bytes and extended past the sliding
    window, a checkpoint gives the logits and cache state of one cold prefill."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.engine import cache_layers
    from mlxd.engine.cache_entry import decode_entry, encode_entry, model_cache_layout
    from mlxd.engine.prefix_cache import PrefixCache

    path = build_family(name)

    def scenario():
        model, tokenizer = load(str(path))
        tokens = tokenizer.encode(LONG_SYSTEM)[:6 * WINDOW]
        split = 2 * WINDOW + 7  # past the window, and not on a chunk boundary

        def prefill(cache, part, chunk=40):
            logits = None
            for i in range(0, len(part), chunk):
                logits = model(mx.array(part[i : i + chunk])[None], cache=cache)
            mx.eval(logits)
            return logits[0, -1]

        cold_cache = make_prompt_cache(model)
        cold = prefill(cold_cache, tokens)
        live = make_prompt_cache(model)
        prefill(live, tokens[:split], chunk=64)
        store = PrefixCache(max_bytes=1 << 30)
        assert store.insert(tokens[:split], live, "prompt")
        # The live cache goes on decoding: the checkpoint must not change.
        prefill(live, tokens[split : split + 20])
        warm_cache, reused = store.fetch(tokens)
        assert reused == split
        warm = prefill(warm_cache, tokens[split:])
        entry = decode_entry(encode_entry(tokens[:split], store.snapshot()[0].cache, "fp", "prompt"), "fp", split,
                             model_cache_layout(model, None))
        restored_cache = entry.cache
        restored = prefill(restored_cache, tokens[split:])
        report = []
        for other, cache in ((warm, warm_cache), (restored, restored_cache)):
            states = list(zip(_window_state(cold_cache), _window_state(cache)))
            report.append({
                "logits": mx.allclose(cold, other, atol=1e-4, rtol=1e-4).item(),
                "greedy": int(mx.argmax(cold)) == int(mx.argmax(other)),
                "positions": cache_layers.positions(cache) == cache_layers.positions(cold_cache),
                "state": bool(states) and all(
                    a.shape == b.shape and mx.allclose(a, b, atol=1e-4, rtol=1e-4).item() for a, b in states),
            })
        return report

    for report in run(worker.call(scenario)):
        assert report == {"logits": True, "greedy": True, "positions": True, "state": True}


def _window_state(cache):
    """What the next token attends to: each rotating layer's last window in
    temporal order, each state array, each full KV layer's arrays."""
    import mlx.core as mx

    out = []
    for layer in cache:
        kind = type(layer).__name__
        if kind == "CacheList":
            out += _window_state(layer.caches)
        elif kind == "RotatingKVCache":
            for v in (layer.keys, layer.values):
                ordered = layer._temporal_order(v)
                out.append(ordered[..., -(layer.max_size - 1):, :])
        elif kind == "ArraysCache":
            out += [a for a in layer.cache if a is not None]
        else:
            out += [layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :]]
    return [mx.contiguous(a) for a in out]
