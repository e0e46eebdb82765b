"""Which device MLX runs on and how much memory it has: what "70%" means.

A memory budget written as a percentage is a share of the memory models
actually live in: the GPU's own memory on CUDA, Metal's recommended working
set on Apple silicon (the most the GPU should wire; less than total RAM), and
system RAM on the CPU backend. On an H200 host psutil's RAM (126 GiB) and the
GPU's memory (140 GiB) differ; a host with more RAM than GPU memory would
otherwise promise memory the GPU does not have.

:func:`describe_device` is pure: it reads the figures a probe gathered, so
tests feed it CUDA, Metal and CPU answers. :func:`probe_device` is the shell
that asks MLX and psutil.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from collections.abc import Mapping
from typing import Any

CUDA = "cuda"
METAL = "metal"
CPU = "cpu"

SOURCE_GPU = "GPU memory (mx.device_info total_memory)"
SOURCE_METAL = "Metal recommended working set (max_recommended_working_set_size)"
SOURCE_RAM = "system RAM"


@dataclass(frozen=True)
class DeviceProbe:
    """Raw answers: ``mx.default_device()``'s type, ``mx.device_info()``, RAM."""

    device_type: str  # "gpu" or "cpu", as mlx names it
    info: Mapping[str, Any]
    ram_bytes: int
    platform: str = sys.platform


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # cuda | metal | cpu
    name: str
    memory_bytes: int  # what a percentage budget is a share of
    memory_source: str
    ram_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def describe_device(probe: DeviceProbe) -> DeviceInfo:
    info = probe.info
    name = str(info.get("device_name") or info.get("architecture") or probe.device_type)
    if probe.device_type == "gpu":
        working_set = _positive_int(info.get("max_recommended_working_set_size"))
        if probe.platform == "darwin" or working_set is not None:
            # Unified memory: the GPU may wire at most the working set, and it
            # shares it with everything else on the machine.
            memory = working_set or _positive_int(info.get("memory_size")) or probe.ram_bytes
            source = SOURCE_METAL if working_set else SOURCE_RAM
            return DeviceInfo(METAL, name, memory, source, probe.ram_bytes)
        total = _positive_int(info.get("total_memory")) or _positive_int(info.get("memory_size"))
        if total is not None:
            return DeviceInfo(CUDA, name, total, SOURCE_GPU, probe.ram_bytes)
        return DeviceInfo(CUDA, name, probe.ram_bytes, SOURCE_RAM, probe.ram_bytes)
    return DeviceInfo(CPU, name, probe.ram_bytes, SOURCE_RAM, probe.ram_bytes)


def probe_device() -> DeviceProbe:
    """Ask MLX which device it defaults to and what it knows about it."""
    import mlx.core as mx
    import psutil

    ram = int(psutil.virtual_memory().total)
    device = mx.default_device()
    device_type = "gpu" if device.type == mx.DeviceType.gpu else "cpu"
    try:
        info = dict(mx.device_info())
    except (RuntimeError, AttributeError):
        info = {}
    return DeviceProbe(device_type, info, ram)


def current_device() -> DeviceInfo:
    return describe_device(probe_device())
