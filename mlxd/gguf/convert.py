"""A GGUF file to an mlx-lm model folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that ``mlx_lm.load`` serves."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mlx.core as mx

from mlxd.dtypes import ALIASES, DTYPES
from mlxd.errors import GGUFError
from mlxd.files import build_once
from mlxd.gguf.config import GGUF_GROUP_SIZE, build_config, quantized_layers
from mlxd.gguf.names import check_architecture, rename
from mlxd.gguf.reader import read_gguf
from mlxd.gguf.tokenizer import build_tokenizer, write_tokenizer

log = logging.getLogger(__name__)

QUANTIZE_BITS = (2, 3, 4, 6, 8)
# "keep": the file's own types, quantized blocks left quantized.
KEEP = "keep"


def import_dtype(requested: str | None) -> str:
    """A ``--dtype`` value as ``keep`` or a float dtype name; GGUFError names
    the choices for anything else."""
    name = (requested or KEEP).strip().lower()
    name = ALIASES.get(name, name)
    if name != KEEP and name not in DTYPES:
        raise GGUFError(f"unknown dtype {requested!r}; choose from {KEEP}, {', '.join(DTYPES)}")
    return name


def dequantize(tensors: dict[str, mx.array], dtype: str) -> dict[str, mx.array]:
    """Every quantized matrix as plain ``dtype`` floats (its scales and biases
    dropped) and every other float tensor cast to ``dtype``.

    MLX's CPU backend runs only float32 matrix products through BLAS; its
    quantized kernels are several times slower there (docs/performance.md).
    """
    target = getattr(mx, dtype)
    layers = quantized_layers(tensors)
    packed = {f"{layer}.{part}" for layer in layers for part in ("scales", "biases")}
    out: dict[str, mx.array] = {}
    for name, value in tensors.items():
        if name in packed:
            continue
        layer = name.removesuffix(".weight")
        if layer != name and layer in layers:
            group_size, bits = layers[layer]
            # Scale and offset in float32: float16 arithmetic would round
            # each weight once more before the cast.
            value = mx.dequantize(
                value, tensors[f"{layer}.scales"].astype(mx.float32),
                tensors[f"{layer}.biases"].astype(mx.float32), group_size=group_size, bits=bits,
            )
        if mx.issubdtype(value.dtype, mx.floating):
            value = value.astype(target)
        out[name] = value
    return out


def requantize(tensors: dict[str, mx.array], bits: int) -> dict[str, mx.array]:
    """Quantize the matrices the file held as floats (or that were dequantized
    on reading); those MLX kept quantized stay as they are."""
    if bits not in QUANTIZE_BITS:
        raise GGUFError(f"cannot quantize to {bits} bits (choose from {', '.join(map(str, QUANTIZE_BITS))})")
    out = dict(tensors)
    for name, value in tensors.items():
        layer = name.removesuffix(".weight")
        if (
            layer == name or value.ndim != 2 or f"{layer}.scales" in tensors
            or value.shape[-1] % GGUF_GROUP_SIZE or not mx.issubdtype(value.dtype, mx.floating)
        ):
            continue
        weight, scales, biases = mx.quantize(value, group_size=GGUF_GROUP_SIZE, bits=bits)
        out[name], out[f"{layer}.scales"], out[f"{layer}.biases"] = weight, scales, biases
    return out


def import_gguf(source: Path, target: Path, *, quantize_bits: int | None = None, dtype: str = KEEP) -> Path:
    """Convert ``source`` into the new folder ``target`` and return it.

    ``dtype`` other than ``keep`` dequantizes the quantized matrices and casts
    every float to it; ``quantize_bits`` quantizes the float matrices. The
    folder appears whole or not at all (written beside it, then renamed).
    """
    source, target = Path(source), Path(target)
    dtype = import_dtype(dtype)
    if quantize_bits is not None and dtype != KEEP:
        raise GGUFError(f"--quantize {quantize_bits} cannot be combined with --dtype {dtype}, "
                        "which dequantizes every matrix: use one or the other")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise GGUFError(f"{target} already exists and is not an empty folder")
    return build_once(target, lambda out: write_model_folder(source, out, quantize_bits=quantize_bits, dtype=dtype))


def write_model_folder(source: Path, folder: Path, *, quantize_bits: int | None = None, dtype: str = KEEP) -> None:
    """Fill the empty ``folder`` with the mlx-lm model converted from ``source``."""
    contents = read_gguf(source)
    architecture = str(contents.metadata.get("general.architecture", "(none)"))
    check_architecture(architecture)
    tokenizer = build_tokenizer(contents.metadata)
    tensors = rename(contents.tensors)
    if "model.embed_tokens.weight" not in tensors:
        raise GGUFError(f"{source} has no token embeddings (token_embd.weight)")
    if quantize_bits is not None:
        tensors = requantize(tensors, quantize_bits)
    if dtype != KEEP:
        tensors = dequantize(tensors, dtype)
    config = build_config(
        architecture, contents.metadata, tensors,
        eos_token_ids=tokenizer.eos_token_ids, bos_token_id=tokenizer.bos_token_id,
        dtype=None if dtype == KEEP else dtype,
    )
    vocab = len(contents.metadata["tokenizer.ggml.tokens"])
    if vocab > config["vocab_size"]:
        raise GGUFError(f"{source} has {vocab} tokens but embeddings for only {config['vocab_size']}")
    folder.chmod(0o755)  # a temporary folder starts 0700, which would hide the model from others
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(tokenizer, folder)
    log.info("converted %s (%s, dtype %s)", source, architecture, dtype)
