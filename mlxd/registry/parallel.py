"""``parallel:`` of a local entry -> its ParallelSpec, and whether the model
can be split that way, from its config.json and files alone (pure but for
reading the folder; no MLX).

Tensor parallelism cuts every attention and MLP projection into equal
parts, one per rank, and mlx-lm's ``shard`` divides the head counts by the
rank count without checking: 9 heads over 2 ranks loads and answers
garbage. So the counts are checked here. Pipeline parallelism gives each
rank a run of layers and needs the weight index to know which files hold
which layer.
"""

from __future__ import annotations

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
    )


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) and "num_attention_heads" in inner else config


def split_problem(spec: ParallelSpec, config: Mapping[str, Any], folder: Path) -> str | None:
    """Why this model cannot be split as ``spec`` says (None: it can)."""
    n = spec.size
    cfg = _text_config(config)
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
    if not (folder / WEIGHT_INDEX).is_file():
        return (f"a pipeline split needs `{WEIGHT_INDEX}` (which file holds which layer) in {folder}; "
                "convert the model with mlx_lm.convert")
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
        if spec.transport != "ring":
            return "transport", (f"ranks on other hosts run over `ring` here, not `{spec.transport}` "
                       "(mlxd does not start jaccl or nccl ranks on other hosts yet)")
    if spec.transport == "jaccl" and all(h == LOCAL for h in spec.hosts):
        return "transport", "jaccl connects machines over Thunderbolt; ranks on this machine use `ring`"
    return None
