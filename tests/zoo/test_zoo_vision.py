"""The zoo's vision families (mlx-vlm) through mlxd: an image in the chat,
single, concurrent (mlxd's vision engine takes them in turn), streamed and
with a stop string, each against plain mlx-vlm; what mlxd's vision engine
cannot do yet (tools, response_format) refused as the zoo table says."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from vision.vision_support import PROMPT, data_url, image_chat, noise_image, solid_image
from zoo.test_zoo_paths import REPORT, TOOLS, middle_word, ok, refused
from zoo.zoo_support import VISION_FAMILIES, answer_text, chat, family

pytestmark = pytest.mark.mlx

# What mlx-vlm's own template call receives for the same user turn.
IMAGE_CHAT = [{"role": "user", "content": [{"type": "text", "text": PROMPT}, {"type": "image"}]}]


@pytest.fixture(params=VISION_FAMILIES)
def vision_family(request: pytest.FixtureRequest) -> str:
    return request.param


def test_the_answer_about_an_image_is_mlx_vlm_s(zoo_daemon, reference, vision_family):
    for image in (noise_image(), solid_image()):
        choice = ok(chat(zoo_daemon, vision_family, image_chat(data_url(image)), max_tokens=16))
        assert answer_text(choice["message"]) == reference.vision(vision_family, IMAGE_CHAT, [image], 16)


def test_concurrent_image_requests_each_get_mlx_vlm_s_answer(zoo_daemon, reference, vision_family):
    images = [noise_image(seed) for seed in (1, 2, 3)]
    with ThreadPoolExecutor(len(images)) as pool:
        replies = list(
            pool.map(lambda im: chat(zoo_daemon, vision_family, image_chat(data_url(im)), max_tokens=16), images)
        )
    for image, reply in zip(images, replies, strict=True):
        assert answer_text(ok(reply)["message"]) == reference.vision(vision_family, IMAGE_CHAT, [image], 16)


def test_streamed_image_answer_joins_to_mlx_vlm_s(zoo_daemon, reference, vision_family):
    body = {"model": vision_family, "messages": image_chat(data_url(noise_image())), "temperature": 0,
            "max_tokens": 16, "stream": True}
    pieces = []
    with httpx.stream("POST", f"{zoo_daemon.url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces += [answer_text(c.get("delta", {})) for c in json.loads(line[6:]).get("choices", [])]
    assert "".join(pieces) == reference.vision(vision_family, IMAGE_CHAT, [noise_image()], 16)


def test_a_stop_string_cuts_the_image_answer(zoo_daemon, reference, vision_family):
    expected = reference.vision(vision_family, IMAGE_CHAT, [noise_image()], 16)
    stop = middle_word(expected)
    choice = ok(chat(zoo_daemon, vision_family, image_chat(data_url(noise_image())), max_tokens=16, stop=[stop]))
    assert answer_text(choice["message"]) == expected[: expected.index(stop)]
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": REPORT}}},
         "response_format"),
        ("tools", {"tools": TOOLS}, "tools"),
        ("forced_tool", {"tools": TOOLS, "tool_choice": "required"}, "tools"),
    ],
)
def test_what_the_vision_engine_cannot_do_is_refused_as_the_table_says(zoo_daemon, vision_family, path, fields, param):
    assert path in family(vision_family).unsupported
    reply = chat(zoo_daemon, vision_family, image_chat(data_url(noise_image())), **fields)
    assert param in refused(reply, param)
