"""Restore or recompute: the decision table from measured rates."""

from __future__ import annotations

import pytest

from mlxd.engine.restore_policy import RateMeter, Rates, decide

MB = 1024**2
# A bench-size (Qwen2.5-0.5B-shaped) bf16 model keeps ~12 KB of KV per token.
KV_PER_TOKEN = 12 * 1024
CPU = 75.0  # prefill tokens/s, f32 with OpenBLAS on 2 cores
H200 = 12_500.0  # prefill tokens/s: a 2k prompt in 0.16 s
NVME = 2_000 * MB  # read + decode, bytes/s
SLOW_DISK = 100 * MB


@pytest.mark.parametrize(
    "tokens, prefill, restore, expected",
    [
        # On a CPU restoring always wins: prefill is slow.
        (2_000, CPU, SLOW_DISK, True),
        (32_000, CPU, SLOW_DISK, True),
        # On the GPU from a fast disk, restoring still wins at every size ...
        (2_000, H200, NVME, True),
        (32_000, H200, NVME, True),
        # ... from a slow disk the GPU recomputes a long prompt faster than it reads it.
        (2_000, H200, SLOW_DISK, False),
        (32_000, H200, SLOW_DISK, False),
        # A short entry is not worth the per-entry overhead on a fast GPU.
        (8, H200, NVME, False),
        # Nothing measured yet: restore (the behaviour before measuring).
        (2_000, None, NVME, True),
        (2_000, H200, None, True),
        (2_000, 0.0, NVME, True),
    ],
)
def test_restore_or_recompute(tokens, prefill, restore, expected):
    decision = decide(tokens, tokens * KV_PER_TOKEN, Rates(prefill, restore))
    assert decision.restore is expected
    if prefill and restore:
        assert (decision.restore_s < decision.recompute_s) is expected
    else:
        assert "no measured" in decision.reason


def test_the_decision_says_both_costs():
    decision = decide(2_000, 2_000 * KV_PER_TOKEN, Rates(H200, SLOW_DISK))
    assert decision.recompute_s == pytest.approx(0.16)
    assert decision.restore_s == pytest.approx(0.002 + 2_000 * KV_PER_TOKEN / SLOW_DISK)
    assert decision.reason.startswith("recompute 160.0 ms <= restore")


def test_the_meter_averages_over_bytes_not_over_entries():
    meter = RateMeter()
    assert meter.rate is None
    meter.record(100 * MB, 1.0)
    meter.record(1 * MB, 1.0)  # a small, slow entry counts for its bytes only
    meter.record(5 * MB, 0.0)  # an untimed one is ignored
    assert meter.rate == pytest.approx(101 * MB / 2.0)


@pytest.mark.mlx
def test_a_load_restores_only_what_this_device_recomputes_more_slowly(worker, qwen_tiny, tmp_path):
    """Real saved entries, restored with an injected prefill speed: a slow
    device restores them all; on one that prefills faster than any disk, the
    first entry is restored (that measures the restore speed) and the rest are
    left for their requests to recompute."""
    from prefix_cache.cache_support import QUESTIONS, chat, greedy, populate, run, spec_for

    from mlxd.engine.cache_store.folder import CacheStore
    from mlxd.engine.cache_store.persistence import PrefixCachePersistence
    from mlxd.engine.fingerprint import model_fingerprint
    from mlxd.engine.prefix_cache import PrefixCache

    spec = spec_for(qwen_tiny)
    run(populate(worker, spec, tmp_path, [greedy(messages=chat(q)) for q in QUESTIONS[:3]]))
    fingerprint = model_fingerprint(qwen_tiny, None)

    async def restore_at(tokens_per_s):
        cache = await worker.call(PrefixCache, 64 << 20)
        store = CacheStore(tmp_path / "prefix", fingerprint, 256 << 20)
        persistence = PrefixCachePersistence(store, worker, cache, prefill_rate=lambda: tokens_per_s)
        return await persistence.restore(), persistence.stats.recompute_entries, cache.entries

    assert run(restore_at(1.0)) == (3, 0, 3)
    assert run(restore_at(None)) == (3, 0, 3)
    assert run(restore_at(1e12)) == (1, 2, 1)
