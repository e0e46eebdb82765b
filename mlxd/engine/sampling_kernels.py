"""mlx-lm's sampling filters with their parameters as arrays.

mlx-lm compiles ``apply_top_p``, ``apply_min_p`` and ``categorical_sampling``
with the request's temperature, top_p and min_p as Python floats. ``mx.compile``
makes a Python scalar part of the traced graph, so each new value is a new
fused kernel, compiled on first use: g++ on the CPU backend (3.2 s for the
first request at temperature 0.7 on this machine, 1.0 s more for the next one
at 0.8), NVRTC on CUDA. A daemon's clients send all sorts of values, and a
warm-up cannot guess them. Passed as arrays, the values are kernel inputs:
one warm-up request with sampling compiles what every later value uses.

The math is mlx-lm's (mlx_lm/sample_utils.py), in the same order, and is
checked against it in tests/engine/test_sampling_kernels.py. Parameters are
float32 scalars, cast to the logits' dtype where mlx-lm's Python float would
have been, so a bfloat16 model compares and scales in bfloat16 as before.
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx


@mx.compile
def top_p(logprobs: mx.array, top_p: mx.array) -> mx.array:
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


@mx.compile
def min_p(logprobs: mx.array, log_min_p: mx.array) -> mx.array:
    """Tokens less likely than ``min_p`` times the top one are dropped
    (mlx-lm's ``apply_min_p`` with ``min_tokens_to_keep=1``)."""
    top_logprobs = mx.max(logprobs, axis=-1, keepdims=True)
    scaled_min_p = top_logprobs + log_min_p.astype(logprobs.dtype)
    return mx.where(logprobs < scaled_min_p, -float("inf"), logprobs)


@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def categorical(logits: mx.array, inverse_temp: mx.array) -> mx.array:
    return mx.random.categorical(logits * inverse_temp.astype(logits.dtype))


@mx.compile
def categorical_with_key(logits: mx.array, inverse_temp: mx.array, key: mx.array) -> mx.array:
    return mx.random.categorical(logits * inverse_temp.astype(logits.dtype), key=key)
