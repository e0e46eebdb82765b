"""Checkpoints of caches that cannot be trimmed: one restored (from memory or
from its bytes) and extended past the sliding window is exactly what one cold
prefill reaches; CacheList layers (mamba + attention side by side) keep,
trim and persist as their parts do; superseded checkpoints are bounded.

Models are the zoo's (mlxd/factory/zoo.py), each family's real architecture
at a toy size (sliding window 32).
"""

from __future__ import annotations

import pytest
from prefix_cache.cache_support import SYSTEM, run

from mlxd.factory.zoo_build import build_family

# Sliding-window, SSM/linear-attention hybrid families of the zoo.
UNTRIMMABLE = ["gemma3_text", "gemma4_text", "gpt_oss", "qwen3_next", "qwen3_5", "lfm2", "nemotron_h"]
WINDOW = 32
LONG_SYSTEM = SYSTEM * 2


@pytest.mark.parametrize("name", UNTRIMMABLE)
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


def _cache_list(tokens: int):
    """Falcon-H1's layer cache: an SSM state beside a KV cache (values tell positions apart)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache

    layers = []
    for _ in range(2):
        state = ArraysCache(2)
        state[0] = mx.full((1, 3, 8), float(tokens))
        state[1] = mx.full((1, 2, 4, 4), -float(tokens))
        kv = KVCache()
        x = mx.arange(tokens * 8, dtype=mx.float32).reshape(1, 1, tokens, 8)
        kv.update_and_fetch(x, -x)
        layers.append(CacheList(state, kv))
    return layers


def test_cache_list_layers_are_kept_exactly_and_persist(worker):
    from mlxd.engine.cache_entry import CacheLayout, EntryError, decode_entry, encode_entry
    from mlxd.engine.prefix_cache import PrefixCache

    def scenario():
        cache = PrefixCache(max_bytes=1 << 20)
        tokens = list(range(100, 130))
        assert cache.insert(tokens, _cache_list(30), "prompt")
        # An SSM state cannot be trimmed: a longer prompt reuses it, a diverging one cannot.
        hit, reused = cache.fetch(tokens + [1, 2])
        assert reused == 30 and float(hit[0].caches[0][0][0, 0, 0]) == 30.0
        assert cache.fetch(tokens[:20] + [5] * 12) == (None, 0)
        # Persisted: the same layers, types and shapes back; a layout of other shapes refuses it.
        layout = CacheLayout.of(_cache_list(1))
        entry = decode_entry(encode_entry(tokens, cache.snapshot()[0].cache, "fp", "prompt"), "fp", 30, layout)
        assert entry.kind == "prompt" and entry.tokens == tokens
        assert [type(c).__name__ for c in entry.cache[0].caches] == ["ArraysCache", "KVCache"]
        other = _cache_list(1)
        other[1].caches[1].keys = other[1].caches[1].keys[..., :4]
        with pytest.raises(EntryError, match="layer 1 is CacheList"):
            CacheLayout.of(other).check(entry.cache)
        return True

    assert run(worker.call(scenario))


def test_superseded_checkpoints_are_bounded_and_evicted_first(worker):
    """A conversation that moves on leaves older checkpoints behind: at most
    ``max_superseded`` stay, the system checkpoint always does."""
    from mlxd.engine.prefix_cache import PrefixCache

    def scenario():
        cache = PrefixCache(max_bytes=1 << 30, max_superseded=2)
        system = list(range(1000, 1010))
        assert cache.insert(system, _cache_list(10), "system")
        turn = list(system)
        for i in range(6):
            turn = turn + [i] * 5
            assert cache.insert(turn, _cache_list(len(turn)), "prompt")
        kept = sorted(len(s.tokens) for s in cache.snapshot())
        # The system prefix, the newest turn and the two most recent superseded ones.
        assert kept == [10, 30, 35, 40]
        one = cache.snapshot()[0].nbytes
        # Under the byte bound, superseded entries go before a live one of another conversation.
        tight = PrefixCache(max_bytes=int(one * 3.5), max_superseded=8)
        tight.insert([7] * 40, _cache_list(40), "prompt")
        turn = list(system)
        for i in range(4):
            turn = turn + [i] * 5
            tight.insert(turn, _cache_list(len(turn)), "prompt")
        assert tight.holds([7] * 40) and tight.holds(turn) and tight.nbytes <= tight.max_bytes
        return kept

    assert run(worker.call(scenario))


@pytest.mark.parametrize("name", ["gemma3_text", "qwen3_next"])
def test_boundaries_render_the_tools_where_the_prompt_has_them(name):
    """Gemma 3's template has no place for tools, so mlxd writes them into the
    turns' text (mlxd.tools.fallback): the probe that finds where the next
    turn leaves the prompt must render them the same way, or it diverges at
    the tools and the checkpoint goes back to the system prompt (turns 3+ of
    a tools conversation then reused only turn 1)."""
    from mlx_lm.utils import load_tokenizer

    from mlxd.engine.checkpoints import boundaries
    from mlxd.engine.prompt import prompt_tokens
    from mlxd.engine.types import GenerationRequest

    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                               "parameters": {"type": "object", "properties": {}}}}]
    tokenizer = load_tokenizer(build_family(name))
    request = GenerationRequest(request_id="r", max_tokens=4, tools=tools, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Read the configuration file"}])
    tokens = prompt_tokens(tokenizer, request)
    marks = {b.kind: b.position for b in boundaries(tokenizer, request, tokens)}
    # The next turn keeps (nearly) the whole prompt; the system part ends after the system prompt.
    assert marks["prompt"] >= len(tokens) - 8, (marks, len(tokens))
    assert marks["system"] > len(tokenizer.encode(SYSTEM)) // 2
