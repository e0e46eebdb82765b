"""A vision model is warmed up as it loads: its first image request
compiles no kernel (with an empty kernel cache the tiny model's took 7.7 s
against 0.03 s on this CPU, the vision tower's and the sampler's kernels
compiled in it)."""

from __future__ import annotations


import httpx
import pytest
from support.daemon import daemon_process, write_registry
from support.kernel_cache import KernelCache
from vision.vision_support import data_url, image_chat, noise_image

pytestmark = pytest.mark.mlx


def test_a_vision_models_first_image_request_compiles_no_kernel(tmp_path, vision_tiny):
    kernels = KernelCache(tmp_path / "tmp")
    registry = write_registry(tmp_path, [{"name": "eyes", "path": str(vision_tiny)}])
    with daemon_process(registry, tmp_path, "--no-watch", env=kernels.env) as d:
        assert httpx.post(f"{d.url}/v1/models/eyes/load", json={}, timeout=300).status_code == 200
        warm = kernels.compiled()
        assert warm, "the warm-up compiled its kernels under TMPDIR"
        eyes = next(m for m in httpx.get(f"{d.url}/v1/status", timeout=30).json()["models"] if m["name"] == "eyes")
        assert eyes["warmup_mode"] == "load" and eyes["warmup_seconds"] > 0, "status tells the warm-up"
        for body in ({"messages": image_chat(data_url(noise_image()))},
                     {"messages": image_chat(data_url(noise_image(2, (40, 90)))), "temperature": 0.9, "top_p": 0.8},
                     {"messages": [{"role": "user", "content": "And without a picture?"}], "temperature": 0}):
            reply = httpx.post(f"{d.url}/v1/chat/completions", timeout=300,
                               json={"model": "eyes", "max_tokens": 4, **body})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] > 0
        assert kernels.compiled() - warm == set()
