"""Which attention kernels MLX's CUDA backend prefills with.

For every attention call with more than one query row, MLX's CUDA backend
picks cuDNN's fused attention and caches one cuDNN execution plan per exact
shape of queries, keys and mask. mlxd prefills in chunks (512 tokens) against
a growing KV cache, so every chunk of every prompt has a key length not seen
before, and each one builds a plan. MLX's own kernels (the path it takes
where cuDNN does not apply) have no per-shape build. Measured through
`mlxd serve` on an H200, bench-size bf16 model (bench/kernel_misses.py):

    time to first token   cuDNN   MLX's own
    2k-token chat         0.26 s  0.155 s
    8k-token chat         0.85 s  0.39 s
    four 2k chats at once 1.76 s  0.87 s

So the daemon sets ``MLX_CUDA_USE_CUDNN_SDPA=0`` at start, unless the user set
it. MLX reads it once, at the first attention call; other backends ignore it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CUDNN_SDPA_ENV = "MLX_CUDA_USE_CUDNN_SDPA"


def attention_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to ``env``: empty when the user chose."""
    if env.get(CUDNN_SDPA_ENV):
        return {}
    return {CUDNN_SDPA_ENV: "0"}


def prefer_mlx_attention_kernels() -> dict[str, str]:
    """Set the variable in this process (call before MLX runs anything)."""
    added = attention_env(os.environ)
    os.environ.update(added)
    return added
