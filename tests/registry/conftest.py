"""Model folders and fixtures for registry tests.

Most tests need a folder that *looks* like a model (config.json and a valid
safetensors file of a known size) but never load it, so they are written by
hand here in microseconds. The exactness test uses a real factory model.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

LLAMA_LIKE = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "torch_dtype": "float16",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    """A valid safetensors file: ``name -> (dtype, shape, bytes)``, zero data."""
    header: dict[str, Any] = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def make_model_dir(
    folder: Path, *, config: dict[str, Any] | None = None, weight_bytes: int = 4096
) -> Path:
    """A folder with config.json and one model.safetensors of ``weight_bytes``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or LLAMA_LIKE))
    write_safetensors(
        folder / "model.safetensors", {"w": ("F16", [weight_bytes // 2], weight_bytes)}
    )
    return folder


@pytest.fixture
def llama_like() -> dict[str, Any]:
    return dict(LLAMA_LIKE)


@pytest.fixture
def make_model():
    """``make_model(folder, config=..., weight_bytes=...)`` -> a model folder."""
    return make_model_dir


@pytest.fixture
def write_weights():
    """``write_weights(path, {name: (dtype, shape, nbytes)})`` -> a safetensors file."""
    return write_safetensors


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "models" / "llama-like")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from mlxd.factory import ModelRecipe, build_model

    return build_model(ModelRecipe(arch="qwen2", size="tiny"))
