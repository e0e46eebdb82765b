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
