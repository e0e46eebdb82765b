"""``parallel:`` of a local entry -> its ParallelSpec, and whether the model
can be split that way, from its config.json and files alone (pure but for
reading the folder; no MLX).

Tensor parallelism cuts every attention and MLP projection into equal
parts, one per rank, and mlx-lm's ``shard`` divides the head counts by the
rank count without checking: 9 heads over 2 ranks loads and answers
garbage. So the counts are checked here. Pipeline parallelism gives each
rank a run of layers; a weight index, when the model has one, must name
every layer. And the model's family must offer the split at all (mlx-lm's
class for it, read without importing mlx-lm).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxd.registry.model import ParallelSpec
from mlxd.registry.schema import ParallelSection

LOCAL = "local"
# The dimensions a tensor split must divide, as config.json names them.
TENSOR_DIMS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")
WEIGHT_INDEX = "model.safetensors.index.json"


def default_transport(device_kind: str) -> str:
    """``transport: any``: NCCL between the GPUs of a CUDA host, else the ring
    over TCP (jaccl needs Thunderbolt between Macs, so it is asked for by name)."""
    return "nccl" if device_kind == "cuda" else "ring"


def hosts_of(section: ParallelSection) -> tuple[str, ...]:
    ranks = section.ranks
    return (LOCAL,) * ranks if isinstance(ranks, int) else tuple(ranks)


def parallel_spec(section: ParallelSection, device_kind: str,
                  remotes: tuple[tuple[str, str, str | None], ...] = ()) -> ParallelSpec:
    hosts = hosts_of(section)
    if section.transport != "any":
        transport = section.transport
    else:
        # Ranks on several machines meet over TCP unless told otherwise.
        transport = "ring" if any(h != LOCAL for h in hosts) else default_transport(device_kind)
    return ParallelSpec(
        mode=section.mode, hosts=hosts, transport=transport,
        load_timeout_s=section.load_timeout_s, prefill_timeout_s=section.prefill_timeout_s,
        step_timeout_s=section.step_timeout_s, remotes=remotes,
        rdma_devices=tuple(tuple(row) for row in section.rdma_devices) if section.rdma_devices else None,
    )


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) and "num_attention_heads" in inner else config


def family_splits(model_type: str) -> set[str] | None:
    """The splits mlx-lm's class for ``model_type`` offers (``tensor`` with a
    ``shard`` method, ``pipeline`` with its PipelineMixin), read from the
    module's source without importing it (mlx-lm's package imports
    transformers); None when the module is not found (a remapped type: the
    rank's load says then)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("mlx_lm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations or not model_type.isidentifier():
        return None
    for root in spec.submodule_search_locations:
        source = Path(root) / "models" / f"{model_type}.py"
        if source.is_file():
            text = source.read_text(errors="replace")
            found = {"tensor"} if "def shard(" in text else set()
            return found | ({"pipeline"} if "PipelineMixin" in text or "def pipeline(" in text else set())
    return None


def split_problem(spec: ParallelSpec, config: Mapping[str, Any], folder: Path) -> str | None:
    """Why this model cannot be split as ``spec`` says (None: it can)."""
    n = spec.size
    cfg = _text_config(config)
    model_type = str(config.get("model_type", ""))
    offered = family_splits(model_type)
    if offered is not None and spec.mode not in offered:
        other = " (it has a tensor split: `mode: tensor`)" if "tensor" in offered else (
            " (it has a pipeline split: `mode: pipeline`)" if "pipeline" in offered else "")
        return f"mlx-lm's `{model_type}` models have no {spec.mode} split{other}"
    if spec.mode == "tensor":
        for key in TENSOR_DIMS:
            value = cfg.get(key)
            if key == "num_key_value_heads" and value is None:
                value = cfg.get("num_attention_heads")
            if not isinstance(value, int):
                return f"config.json has no `{key}`, which a tensor split over {n} ranks divides"
            if value % n:
                return (f"a tensor split over {n} ranks divides `{key}` ({value}) by {n}, "
                        f"which does not go evenly; use a rank count that divides it")
        return None
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < n:
        return f"a pipeline over {n} ranks needs at least {n} layers (config.json has {layers})"
    return _index_problem(folder, layers)


def _index_problem(folder: Path, layers: int) -> str | None:
    """With a weight index (which file holds which layer), every layer must
    be in it, or a rank would run layers with no weights (mlx-lm's check)."""
    index = folder / WEIGHT_INDEX
    if not index.is_file():
        return None  # one file of weights: each rank reads only its layers from it
    try:
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        return f"`{WEIGHT_INDEX}` cannot be read"
    found = {int(m.group(1)) for k in weight_map if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", k))}
    missing = sorted(set(range(layers)) - found)
    if missing:
        return f"`{WEIGHT_INDEX}` has no weights for layers {missing[:8]}; convert the model with mlx_lm.convert"
    return None


def placement_problem(spec: ParallelSpec, backends: Mapping[str, str]) -> tuple[int | str, str] | None:
    """A rank that cannot be placed: (its index, or ``"transport"`` when the
    transport is what cannot reach it; why). Rank 0 is the daemon's own; a
    rank elsewhere is started by the mlxd there (``backends`` maps each
    backend's name to its kind)."""
    for i, host in enumerate(spec.hosts):
        if host == LOCAL:
            continue
        if i == 0:
            return i, "rank 0 runs here: write `local` first"
        if host not in backends:
            return i, f"`{host}` is neither `local` nor a backend under `backends:`"
        if backends[host] != "mlxd":
            return i, f"backend `{host}` is not an mlxd (`kind: mlxd`): only an mlxd starts ranks"
        if spec.transport not in ("ring", "jaccl"):
            return "transport", (f"ranks on other hosts run over `ring` or `jaccl`, not `{spec.transport}` "
                                 "(mlxd starts NCCL ranks on this host's GPUs only)")
    if spec.transport == "jaccl":
        if all(h == LOCAL for h in spec.hosts):
            return "transport", "jaccl connects machines over Thunderbolt; ranks on this machine use `ring`"
        if len(set(spec.hosts)) != len(spec.hosts):
            return "transport", "jaccl runs one rank per machine: name each host once"
        if spec.rdma_devices is None:
            return "transport", ("jaccl needs `rdma_devices`: the RDMA device joining each pair of hosts, "
                                 "as `mlx.distributed_config --backend jaccl` finds them")
    return None
