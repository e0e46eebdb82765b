"""mlxd's sampling filters give mlx-lm's results, and take any value a client
sends without compiling a new kernel once the model is warm."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.daemon import daemon_process, write_registry
from support.kernel_cache import KernelCache

pytestmark = pytest.mark.mlx


@pytest.fixture(params=["float32", "bfloat16"])
def logprobs(request):
    import mlx.core as mx

    logits = mx.random.normal((3, 257), key=mx.random.key(7)) * 3
    return (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(getattr(mx, request.param))


def same(a, b) -> bool:
    import mlx.core as mx

    return a.dtype == b.dtype and bool(mx.array_equal(a, b, equal_nan=True))


@pytest.mark.parametrize("value", [0.05, 0.5, 0.9, 0.999])
def test_top_p_drops_what_mlx_lm_drops(logprobs, value):
    import mlx.core as mx
    from mlx_lm import sample_utils

    from mlxd.engine import sampling_kernels

    ours = sampling_kernels.top_p(logprobs, mx.array(value, dtype=mx.float32))
    assert same(ours, sample_utils.apply_top_p(logprobs, value))
    kept = (ours > -float("inf")).sum(axis=-1).tolist()
    assert all(0 < k < logprobs.shape[-1] for k in kept) or value == 0.999


@pytest.mark.parametrize("value", [0.01, 0.1, 0.5])
def test_min_p_drops_what_mlx_lm_drops(logprobs, value):
    import math

    import mlx.core as mx
    from mlx_lm import sample_utils

    from mlxd.engine import sampling_kernels

    ours = sampling_kernels.min_p(logprobs, mx.array(math.log(value), dtype=mx.float32))
    assert same(ours, sample_utils.apply_min_p(logprobs, value))


@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_a_seeded_draw_is_mlx_lms_draw(logprobs, temperature):
    import mlx.core as mx

    from mlxd.engine import sampling_kernels

    key = mx.random.key(11)
    ours = sampling_kernels.categorical_with_key(logprobs, mx.array(1 / temperature, dtype=mx.float32), key)
    theirs = mx.random.categorical(logprobs * (1.0 / temperature), key=key)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_after_the_warmup_new_sampling_values_compile_no_kernel(tmp_path, concurrency):
    """A client's first request at a temperature, top_p or min_p nobody used
    before answers without the backend compiling anything (on this CPU a
    compile took ~0.5 s a kernel, 3.2 s for the first sampled request); on a
    batching model too, with the requests decoding side by side in its batch
    (whose steps the CPU warm-up does not run: its requests end at their
    first token, drawn where the prompt is prefilled)."""
    kernels = KernelCache(tmp_path / "tmp")
    registry = write_registry(tmp_path, [{"name": "qwen", "model": "qwen", "max_concurrency": concurrency}])
    samplings = [
        {"temperature": 0.31, "top_p": 0.77},
        {"temperature": 1.37, "min_p": 0.13, "top_k": 9},
        {"temperature": 0.93, "top_p": 0.61, "seed": 5},
    ]
    with daemon_process(registry, tmp_path, "--no-watch", env=kernels.env) as d:
        assert httpx.post(f"{d.url}/v1/models/qwen/load", json={}, timeout=120).status_code == 200
        warm = kernels.compiled()
        assert warm, "the warm-up compiled the sampling kernels under TMPDIR"

        def ask(number: int) -> dict:
            reply = httpx.post(f"{d.url}/v1/chat/completions", timeout=120, json={
                "model": "qwen", "messages": [{"role": "user", "content": f"Say something {number}"}],
                "max_tokens": 4, **samplings[number]})
            assert reply.status_code == 200, reply.text
            return reply.json()

        with ThreadPoolExecutor(concurrency) as pool:
            replies = list(pool.map(ask, range(len(samplings))))
        assert all(r["usage"]["completion_tokens"] > 0 for r in replies)
        if concurrency > 1:
            assert d.model("qwen")["engine"]["batched_steps"] > 0, "the requests decoded in the batch"
        assert kernels.compiled() - warm == set()
