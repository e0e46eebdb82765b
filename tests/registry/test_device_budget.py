"""What a percentage budget is a share of, for the devices MLX runs on.

The probe's figures are injected (a CPU CI machine has no GPU); the last test
asks the real MLX of this machine.
"""

from __future__ import annotations

import sys

import psutil
import pytest

from mlxd.registry.device import (
    CPU,
    CUDA,
    METAL,
    SOURCE_GPU,
    SOURCE_METAL,
    SOURCE_RAM,
    DeviceProbe,
    current_device,
    describe_device,
)
from mlxd.registry.loader import load_registry_text

GIB = 1024**3

# Figures the H200 host reported (mx.device_info() and psutil).
H200 = DeviceProbe("gpu", {"device_name": "NVIDIA H200", "total_memory": 140 * GIB}, 126 * GIB, "linux")
# A 64 GB Mac: Metal may wire about three quarters of it.
M_SERIES = DeviceProbe(
    "gpu",
    {"device_name": "Apple M3 Max", "memory_size": 64 * GIB, "max_recommended_working_set_size": 48 * GIB},
    64 * GIB,
    "darwin",
)
LINUX_CPU = DeviceProbe("cpu", {"architecture": "x86_64", "device_name": "AMD EPYC"}, 8 * GIB, "linux")
# A workstation with more RAM than GPU memory: the case where RAM over-promises.
SMALL_GPU_BIG_HOST = DeviceProbe("gpu", {"device_name": "RTX 4090", "total_memory": 24 * GIB}, 256 * GIB, "linux")


@pytest.mark.parametrize(
    "probe, kind, memory, source",
    [
        (H200, CUDA, 140 * GIB, SOURCE_GPU),
        (SMALL_GPU_BIG_HOST, CUDA, 24 * GIB, SOURCE_GPU),
        (M_SERIES, METAL, 48 * GIB, SOURCE_METAL),
        (LINUX_CPU, CPU, 8 * GIB, SOURCE_RAM),
        # An MLX that reports nothing about its GPU falls back to RAM, and says so.
        (DeviceProbe("gpu", {}, 32 * GIB, "linux"), CUDA, 32 * GIB, SOURCE_RAM),
        (DeviceProbe("gpu", {"device_name": "Apple M1"}, 16 * GIB, "darwin"), METAL, 16 * GIB, SOURCE_RAM),
    ],
)
def test_the_budget_base_is_the_memory_models_live_in(probe, kind, memory, source):
    device = describe_device(probe)
    assert (device.kind, device.memory_bytes, device.memory_source) == (kind, memory, source)
    assert device.ram_bytes == probe.ram_bytes


def test_names_come_from_mlx(tmp_path):
    assert describe_device(H200).name == "NVIDIA H200"
    assert describe_device(LINUX_CPU).name == "AMD EPYC"


@pytest.mark.parametrize("probe, expected", [(H200, 98 * GIB), (SMALL_GPU_BIG_HOST, int(24 * GIB * 0.7)),
                                             (M_SERIES, int(48 * GIB * 0.7))])
def test_seventy_percent_is_of_the_device(tmp_path, model_dir, probe, expected):
    device = describe_device(probe)
    text = f'manager:\n  memory_budget: "70%"\nmodels:\n  - name: a\n    path: {model_dir}\n'
    registry = load_registry_text(text, tmp_path / "m.yaml", physical_memory=device.memory_bytes)
    assert abs(registry.manager.memory_budget_bytes - expected) <= 1


def test_this_machine_is_probed_through_mlx():
    import mlx.core as mx

    device = current_device()
    if mx.default_device().type == mx.DeviceType.cpu:
        assert device.kind == CPU and device.memory_bytes == psutil.virtual_memory().total
    elif sys.platform == "darwin":
        assert device.kind == METAL and 0 < device.memory_bytes <= psutil.virtual_memory().total
    else:
        assert device.kind == CUDA and device.memory_source == SOURCE_GPU
