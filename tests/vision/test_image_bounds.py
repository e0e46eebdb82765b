"""Decoding is bounded: images shrink to what the model's processor uses
while (JPEG) or right after (PNG, WebP) decoding, decodes share one memory
bound, and a request the queue refuses never decodes anything."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from support.daemon import daemon_in_thread, wait_until, write_registry
from vision.vision_support import data_url, encoded, image_chat, noise_image, solid_image

from mlxd.api.images import DecodeTarget, ImageMemory, ImagePolicy, collect_images
from mlxd.api.openai.bodies import ChatCompletionRequest
from mlxd.errors import BadRequest


def decoded(url: str, folder=None):
    policy = ImagePolicy(model="eyes", model_dir=folder)
    [image] = asyncio.run(collect_images(ChatCompletionRequest(model="eyes", messages=image_chat(url)).conversation(), policy).load())
    return image


def processor_folder(tmp_path, config: dict):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_huge_png_is_reduced_to_what_the_processor_keeps(tmp_path):
    folder = processor_folder(tmp_path, {"max_pixels": 12544})
    image = decoded(data_url(solid_image(size=(7000, 7000)), "PNG"), folder)
    # Reduced by a whole factor, never below the processor's own pixel budget.
    assert image.mode == "RGB"
    assert image.size[0] < 7000 and image.size[0] * image.size[1] >= 12544
    assert 7000 % image.size[0] == 0 or 7000 // image.size[0] >= 2


def test_a_large_jpeg_is_decoded_at_a_smaller_scale(tmp_path):
    folder = processor_folder(tmp_path, {"size": {"shortest_edge": 224}})
    image = decoded(data_url(noise_image(size=(4000, 3000)), "JPEG"), folder)
    assert min(image.size) >= 224 and image.size[0] <= 1000


def test_an_image_the_processor_uses_whole_is_kept_whole(tmp_path):
    folder = processor_folder(tmp_path, {"max_pixels": 12544})
    assert decoded(data_url(noise_image(size=(120, 100)), "PNG"), folder).size == (120, 100)


@pytest.mark.parametrize(
    "config,target",
    [
        ({"max_pixels": 1000}, DecodeTarget(min_pixels=1000)),
        ({"size": {"height": 336, "width": 336}}, DecodeTarget(min_side=336)),
        ({"size": {"shortest_edge": 224}}, DecodeTarget(min_side=224)),
        ({"image_size": 384}, DecodeTarget(min_side=384)),
        ({}, DecodeTarget(min_pixels=DecodeTarget.FALLBACK_PIXELS)),
    ],
)
def test_the_target_comes_from_the_processor_config(tmp_path, config, target):
    assert DecodeTarget.for_model_folder(processor_folder(tmp_path, config)) == target


def test_an_image_that_alone_exceeds_the_memory_bound_is_a_400():
    memory = ImageMemory(1000)

    async def run() -> None:
        async with memory.hold(2000, "messages[0].content[1]"):
            pass

    with pytest.raises(BadRequest) as err:
        asyncio.run(run())
    assert err.value.param == "messages[0].content[1]" and "max_image_memory" in err.value.message


def test_decodes_wait_for_room_under_the_bound():
    memory = ImageMemory(1000)
    order: list[str] = []

    async def one(name: str) -> None:
        async with memory.hold(700, name):
            order.append(f"{name} in")
            await asyncio.sleep(0.01)
            order.append(f"{name} out")

    async def run() -> None:
        await asyncio.gather(one("a"), one("b"))

    asyncio.run(run())
    assert order == ["a in", "a out", "b in", "b out"] and memory.peak == 700 and memory.used == 0


@pytest.mark.mlx
def test_requests_the_queue_refuses_decode_nothing(tmp_path, vision_tiny):
    registry = write_registry(
        tmp_path,
        [{"name": "eyes", "path": str(vision_tiny), "kind": "vision", "max_concurrency": 1, "max_queue": 0,
          "preload": True}],
    )
    big = data_url(solid_image(size=(3000, 3000)), "PNG")
    with daemon_in_thread(registry, tmp_path) as d:
        wait_until(lambda: d.model("eyes")["state"] == "loaded", timeout=120)
        body = {"model": "eyes", "messages": [{"role": "user", "content": "Describe"}], "max_tokens": 3000,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{d.url}/v1/chat/completions", json=body, timeout=120) as stream:
            # Past the first content chunk: the generation holds the only slot.
            lines = stream.iter_lines()
            while '"content":"' not in next(lines).replace('"content":""', ""):
                pass
            refused = [
                httpx.post(f"{d.url}/v1/chat/completions", timeout=60,
                           json={"model": "eyes", "messages": image_chat(big), "max_tokens": 2})
                for _ in range(3)
            ]
        assert [r.status_code for r in refused] == [429, 429, 429]
        assert d.ctx.image_memory.peak == 0
        # Once the slot is free, the same image is decoded and answered.
        ok = httpx.post(f"{d.url}/v1/chat/completions", timeout=120,
                        json={"model": "eyes", "messages": image_chat(big), "max_tokens": 2})
        assert ok.status_code == 200, ok.text[:300]
        assert 0 < d.ctx.image_memory.peak <= d.ctx.image_memory.limit
