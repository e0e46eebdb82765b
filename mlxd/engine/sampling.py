"""SamplingParams -> mlx-lm samplers and logits processors.

Seeds and concurrency: mlx-lm's own samplers draw from MLX's process-wide
random state, so when two requests decode interleaved on the worker, each
one's draws depend on the other's. A request with a ``seed`` therefore gets a
sampler that owns its key (``mx.random.key(seed)``, split once per token):
the same seed, prompt and parameters give the same tokens whether the request
runs alone or alongside others. Requests without a seed keep using the shared
state, i.e. they are not reproducible, as users expect.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mlxd.engine.types import SamplingParams
from mlxd.errors import BadRequest

Sampler = Callable[[Any], Any]
LogitsProcessor = Callable[[Any, Any], Any]


def validate(params: SamplingParams) -> None:
    """Reject values mlx-lm would choke on, with a message for the client."""
    if params.temperature < 0:
        raise BadRequest("temperature must be >= 0.", param="temperature")
    if not 0 <= params.top_p <= 1:
        raise BadRequest("top_p must be in [0, 1].", param="top_p")
    if not 0 <= params.min_p <= 1:
        raise BadRequest("min_p must be in [0, 1].", param="min_p")
    if params.top_k < 0:
        raise BadRequest("top_k must be >= 0 (0 disables it).", param="top_k")
    if params.repetition_penalty <= 0:
        raise BadRequest("repetition_penalty must be > 0.", param="repetition_penalty")


def make_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """Greedy at temperature 0 or top_p 0 (a nucleus of no mass keeps the
    most likely token alone, as OpenAI reads it); otherwise top-p, min-p,
    top-k then a categorical draw."""
    from mlx_lm import sample_utils

    validate(params)
    if params.temperature == 0 or params.top_p == 0:
        return sample_utils.greedy_sampler
    # top_k at or above the vocabulary keeps every token: the same as no top-k
    # (mlx-lm raises for it instead).
    top_k = params.top_k if 0 < params.top_k < vocab_size else 0
    return _chain(params, top_k)


def _chain(params: SamplingParams, top_k: int) -> Sampler:
    """mlx_lm.sample_utils.make_sampler's chain, with the request's values as
    arrays (see ``mlxd.engine.sampling_kernels``), and with the request's own
    key when it has a seed."""
    import mlx.core as mx
    from mlx_lm import sample_utils

    from mlxd.engine import sampling_kernels as kernels

    filters: list[Callable[[Any], Any]] = []
    if 0 < params.top_p < 1.0:
        top_p = mx.array(params.top_p, dtype=mx.float32)
        filters.append(lambda x: kernels.top_p(x, top_p))
    if params.min_p != 0.0:
        log_min_p = mx.array(math.log(params.min_p) if params.min_p > 0 else -math.inf, dtype=mx.float32)
        filters.append(lambda x: kernels.min_p(x, log_min_p))
    if top_k > 0:
        # argpartition's k is a shape, not a value: no array form exists.
        filters.append(lambda x: sample_utils.apply_top_k(x, top_k))
    inverse_temp = mx.array(1.0 / params.temperature, dtype=mx.float32)
    if params.seed is None:
        def shared(logprobs: Any) -> Any:
            for keep in filters:
                logprobs = keep(logprobs)
            return kernels.categorical(logprobs, inverse_temp)

        return shared
    # A negative seed (OpenAI's are signed) as its unsigned two's complement;
    # n choices' seed + i wraps past the top the same way.
    key = mx.random.key(params.seed % 2**64)

    def seeded(logprobs: Any) -> Any:
        nonlocal key
        key, draw = mx.random.split(key)
        for keep in filters:
            logprobs = keep(logprobs)
        return kernels.categorical_with_key(logprobs, inverse_temp, draw)

    return seeded


# The last tokens each penalty looks at (mlx-lm's default, passed as such).
PENALTY_HISTORY = 20


def make_logits_processors(params: SamplingParams) -> list[LogitsProcessor]:
    from mlx_lm import sample_utils

    processors = sample_utils.make_logits_processors(
        repetition_penalty=(
            params.repetition_penalty if params.repetition_penalty != 1.0 else None
        ),
        repetition_context_size=PENALTY_HISTORY,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=PENALTY_HISTORY,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=PENALTY_HISTORY,
    )
    return [_on_device(p, PENALTY_HISTORY) for p in processors]


def device_history(processor: LogitsProcessor) -> int | None:
    """How many of the last tokens ``processor`` reads, where it reads them
    as an array on the device and nothing on the host (the penalties, the
    bias vectors); None where it may read the host (the grammar, the
    reasoning budget). A batch that computes its next step ahead, before
    this step's tokens are read back, can run the first kind there with the
    tokens on their way (``engine/speculative_batch.py``)."""
    return getattr(processor, "device_history", None)


def _on_device(processor: LogitsProcessor, history: int) -> LogitsProcessor:
    processor.device_history = history  # type: ignore[attr-defined]
    return processor


def suppress_tokens(token_ids: set[int] | list[int], vocab_size: int) -> LogitsProcessor:
    """A processor that makes ``token_ids`` impossible (``ignore_eos``)."""
    penalty = [0.0] * vocab_size
    for token in token_ids:
        if 0 <= token < vocab_size:
            penalty[token] = float("-inf")
    return _adding(penalty)


def bias_tokens(bias: dict[int, float], vocab_size: int) -> LogitsProcessor:
    """OpenAI's ``logit_bias``: each token's bias added to its logit before
    sampling.

    Not mlx-lm's ``logit_bias`` processor: that one scatters into the
    logits (``.at[:, ids].add``), a gather/scatter path that compiles its own
    kernels on a GPU's first use (see ``mlxd.engine.warmup``). A dense vector
    added to the logits is the very operation ``ignore_eos`` runs, which the
    warm-up compiles, whatever ids and values a request sends."""
    check_bias_ids(bias, vocab_size)
    values = [0.0] * vocab_size
    for token, value in bias.items():
        values[token] = float(value)
    return _adding(values)


def check_bias_ids(bias: dict[int, float], vocab_size: int) -> None:
    """A ``logit_bias`` id outside the vocabulary is the client's mistake (400)."""
    outside = sorted(token for token in bias if not 0 <= token < vocab_size)
    if outside:
        raise BadRequest(
            f"logit_bias names token id {outside[0]}, which is outside this model's vocabulary "
            f"(ids 0 to {vocab_size - 1}).",
            param="logit_bias",
        )


def _adding(values: list[float]) -> LogitsProcessor:
    """A processor that adds ``values`` (one per token) to the logits."""
    import mlx.core as mx

    vector = mx.array(values)

    def processor(tokens: Any, logits: Any) -> Any:
        return logits + vector.astype(logits.dtype)

    return _on_device(processor, 0)
