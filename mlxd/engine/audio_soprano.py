"""Soprano's synthesis as worker steps: a turn at most TURN_SECONDS long, one chunk a sentence.

mlx-audio's ``Model.generate`` makes a whole line in one call (every
sentence's tokens, then its decoder), which would hold the MLX worker for
the whole line and send nothing until it is done. This runs the same calls
in the same order (the line split, ``_preprocess_text``, ``_tokenize``,
``stream_generate`` with generate's defaults, the decoder, the same trim), so
the random draws and the samples are the ones ``generate`` makes (the
speech tests compare them), but yields after each token (a turn for every
other stream on the worker) and hands each sentence's audio on as soon as
it is decoded. Written against mlx-audio 0.6.2's ``soprano.Model.generate``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from mlxd.engine.host_arrays import to_numpy
from mlxd.engine.worker import SKIP

# soprano.Model.generate's defaults.
TEMPERATURE = 0.3
TOP_P = 0.95
MAX_TOKENS = 512
SPLIT = "\n"
# What one worker turn may hold before other streams get theirs (a chat
# stream's decode step beside it waits at most this long).
TURN_SECONDS = 0.02


def is_soprano(model: Any) -> bool:
    return type(model).__module__.startswith("mlx_audio.tts.models.soprano")


def sentences(model: Any, text: str) -> Iterator[Any]:
    """Worker thread: SKIP between audio tokens once a turn is TURN_SECONDS long, then each sentence's samples."""
    import mlx.core as mx

    prompt = text.replace("\\n", "\n").replace("\\t", "\t")
    for segment in prompt.split(SPLIT):
        if not segment.strip():
            continue
        for prompt_text, _, _ in model._preprocess_text([segment]):
            hidden = []
            turn_began = time.perf_counter()
            for _token, state in model.stream_generate(model._tokenize(prompt_text), max_tokens=MAX_TOKENS,
                                                       temperature=TEMPERATURE, top_p=TOP_P):
                hidden.append(state)
                if time.perf_counter() - turn_began >= TURN_SECONDS:
                    yield SKIP
                    turn_began = time.perf_counter()
            audio = model.decoder(mx.concatenate(hidden, axis=1))
            size = model.config.decoder_config.token_size
            length = len(hidden) * size - size
            audio = audio[0, -length:] if length > 0 else audio[0]
            yield to_numpy(audio).astype(np.float32, copy=False).reshape(-1)
        mx.clear_cache()
