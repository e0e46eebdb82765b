"""A GGUF file to an mlx-lm model folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json) that ``mlx_lm.load`` serves."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mlx.core as mx

from mlxd.errors import GGUFError
from mlxd.factory.build import build_once
from mlxd.gguf.config import GGUF_GROUP_SIZE, build_config
from mlxd.gguf.names import check_architecture, rename
from mlxd.gguf.reader import read_gguf
from mlxd.gguf.tokenizer import build_tokenizer, write_tokenizer

log = logging.getLogger(__name__)

QUANTIZE_BITS = (2, 3, 4, 6, 8)


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


def import_gguf(source: Path, target: Path, *, quantize_bits: int | None = None) -> Path:
    """Convert ``source`` into the new folder ``target`` and return it.

    The folder appears whole or not at all (written beside it, then renamed).
    """
    source, target = Path(source), Path(target)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise GGUFError(f"{target} already exists and is not an empty folder")
    return build_once(target, lambda out: write_model_folder(source, out, quantize_bits=quantize_bits))


def write_model_folder(source: Path, folder: Path, *, quantize_bits: int | None = None) -> None:
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
    config = build_config(
        architecture, contents.metadata, tensors,
        eos_token_ids=tokenizer.eos_token_ids, bos_token_id=tokenizer.bos_token_id,
    )
    vocab = len(contents.metadata["tokenizer.ggml.tokens"])
    if vocab > config["vocab_size"]:
        raise GGUFError(f"{source} has {vocab} tokens but embeddings for only {config['vocab_size']}")
    folder.chmod(0o755)  # a temporary folder starts 0700, which would hide the model from others
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(tokenizer, folder)
    log.info("converted %s (%s)", source, architecture)
