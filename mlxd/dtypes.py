"""Which dtype models are built and GGUF files imported in, per device.

GPUs (CUDA) and Apple's Metal run bfloat16 with fast kernels, and that is what
real models ship in. MLX's Linux CPU backend is the exception: bf16 and
quantized matmuls do not go through BLAS there and run several times slower
than float32 with OpenBLAS (docs/performance.md), so float32 is its default.
"""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")
# Spellings people type on command lines.
ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
           "bf16": "bfloat16", "half": "float16"}
AUTO = "auto"


def default_dtype(device_kind: str) -> str:
    """float32 on the CPU backend, bfloat16 on GPUs and Metal."""
    return "float32" if device_kind == "cpu" else "bfloat16"


def choose_dtype(requested: str | None, device_kind: str) -> str:
    """A ``--dtype`` value (None or "auto": the device's default) as a dtype name.

    Raises ValueError naming the choices for anything else.
    """
    if requested is None or requested.strip().lower() == AUTO:
        return default_dtype(device_kind)
    name = requested.strip().lower()
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; choose from auto, {', '.join(DTYPES)} (or bf16, fp16, f32)")
    return name


def device_dtype(requested: str | None = None) -> str:
    """:func:`choose_dtype` for the device MLX runs on in this process (CUDA
    and Metal are both MLX's ``gpu``, and both want bfloat16)."""
    import mlx.core as mx

    return choose_dtype(requested, "cpu" if mx.default_device() == mx.cpu else "gpu")
