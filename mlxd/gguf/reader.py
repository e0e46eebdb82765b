"""Reading a GGUF file into MLX arrays and plain Python metadata.

``mx.load`` does the work: it keeps Q4_0, Q4_1 and Q8_0 tensors as MLX
quantized triples (``weight`` packed in uint32, ``scales``, ``biases``) with no
round trip through floats, copies F32/F16/BF16 as they are, and dequantizes
some other block types (K-quants) to float16. Where it refuses a file, the
``gguf`` package (llama.cpp's own Python reader) dequantizes instead. The
header is walked first (mlxd.gguf.header): a corrupt file must be an error,
not a crash inside MLX, and a type nobody decodes is named before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxd.errors import GGUFError
from mlxd.gguf.header import scan_header

_FLOATS = {"F32", "F16", "BF16"}


@dataclass
class GGUFContents:
    """A GGUF file's tensors under their GGUF names, and its metadata as
    Python values (str, int, float, bool, lists of those)."""

    tensors: dict[str, mx.array]
    metadata: dict[str, Any]


def read_gguf(path: Path) -> GGUFContents:
    """Read ``path``; raise :class:`GGUFError` naming what is wrong."""
    path = Path(path)
    try:
        infos = scan_header(path)
    except OSError as exc:
        raise GGUFError(f"cannot read {path}: {exc.strerror or exc}") from None
    _check_types(path, infos)
    try:
        tensors, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as exc:
        return _read_with_gguf_package(path, str(exc))
    return GGUFContents(tensors=tensors, metadata={k: _python(v) for k, v in metadata.items()})


def _check_types(path: Path, infos: list) -> None:
    # gguf-py keeps no public list of the block types it can dequantize.
    from gguf.quants import _type_traits

    decodable = _FLOATS | {kind.name for kind in _type_traits}
    for info in infos:
        if info.type_name not in decodable:
            raise GGUFError(
                f"{path}: tensor {info.name} has GGUF type {info.type_name}, which mlxd cannot "
                "convert (it reads F32, F16, BF16, Q4_0, Q4_1, Q8_0, the K-quants and the IQ types)"
            )


def _python(value: Any) -> Any:
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _read_with_gguf_package(path: Path, mlx_message: str) -> GGUFContents:
    """MLX could not read the file: dequantize what MLX lacks with gguf-py."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        # Both readers failed: the file itself is broken (truncated, or not
        # written by a GGUF writer). MLX's message is the more specific one.
        detail = mlx_message.removeprefix("[load_gguf] ")
        raise GGUFError(f"{path} is corrupt or truncated ({detail})") from None
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    tensors: dict[str, mx.array] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind in plain:
            data = np.array(tensor.data)
        else:
            data = dequantize(tensor.data, kind).astype(np.float16)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        tensors[tensor.name] = mx.array(data.reshape(shape))
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    return GGUFContents(tensors=tensors, metadata=metadata)
