"""Whisper's fallback temperatures, warmed once per kernel cache.

A Whisper window that decodes badly (too repetitive, too unlikely) is
decoded again at each temperature of mlx-audio's ladder (0.2 ... 1.0), and
mlx-audio bakes each temperature into a kernel of its own. The load's
warm-up decodes greedily (engine/audio.py), so with an empty kernel cache a
request that falls back compiled those kernels itself: the tiny factory
Whisper's first transcription took 8.0 s on this project's CPU against 3.7
s for the next (random weights always fall back; a trained Whisper on clear
speech rarely does; with this, 3.9 s against 4.0 s). Two tokens at each
temperature, decoded from audio features of zeros (no encoder pass),
compile them; but that cost every load a second on this CPU, kernels
compiled or not, so it runs only when the kernel cache is not known to
hold them: a marker beside the kernels, as the text warm-up's
(engine/warmup_marker.py), written once it ran.
Metal compiles none of these on disk: nothing to do there.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from mlxd.engine.warmup_marker import model_marker
from mlxd.registry.device import current_device

log = logging.getLogger(__name__)

# mlx-audio's ``generate`` default after its greedy first try.
LADDER = (0.2, 0.4, 0.6, 0.8, 1.0)


def warm_ladder(model: Any, name: str, path: Path) -> float | None:
    """Worker thread: decode two tokens at each temperature of the ladder,
    unless the kernel cache is known to hold their kernels; the seconds it
    took, or None when it was not needed."""
    import mlx.core as mx
    from mlx_audio.stt.models.whisper.decoding import DecodingOptions

    device = current_device()
    marker = model_marker(model, path, device.kind, device.name, kv_bits=None, batching=False, runs=(),
                          extra={"whisper_ladder": LADDER})
    if marker is None or marker.known():
        return None
    started = time.perf_counter()
    fp16 = getattr(model, "dtype", None) == mx.float16
    dims = model.dims
    features = mx.zeros((1, dims.n_audio_ctx, dims.n_audio_state), dtype=mx.float16 if fp16 else mx.float32)
    for temperature in LADDER:
        model.decode(features, DecodingOptions(language="en", temperature=temperature, sample_len=2, fp16=fp16))
    seconds = time.perf_counter() - started
    marker.write(name, {"whisper_ladder_seconds": round(seconds, 3)})
    log.info("%s: Whisper's fallback temperatures warmed in %.2fs", name, seconds)
    return seconds
