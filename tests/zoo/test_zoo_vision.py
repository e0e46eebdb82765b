"""The zoo's vision families (mlx-vlm) through mlxd: an image in the chat,
single, concurrent (mlxd's vision engine takes them in turn), streamed and
with a stop string, each against plain mlx-vlm; what mlxd's vision engine
cannot do yet (tools, response_format) refused as the zoo table says."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from vision.vision_support import PROMPT, data_url, image_chat, noise_image, solid_image
from zoo.test_zoo_paths import BUDGET, NOTE, NOTE_TOOL, REPORT, TOOLS, WEATHER, middle_word, ok, refused
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


def test_an_image_answer_in_json_schema_validates(zoo_daemon, vision_family):
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": REPORT, "strict": True}}
    # The budget ends a reasoning the template opened (qwen3_vl's Thinking template): the grammar follows it.
    choice = ok(chat(zoo_daemon, vision_family, image_chat(data_url(noise_image())), response_format=response_format,
                     max_tokens=60, reasoning=BUDGET))
    jsonschema.validate(json.loads(choice["message"]["content"]), REPORT)


def test_tools_on_an_image_turn_go_through_the_familys_format_or_are_refused(zoo_daemon, vision_family):
    messages = image_chat(data_url(noise_image()))
    forced = chat(zoo_daemon, vision_family, messages, tools=[*TOOLS, NOTE_TOOL], tool_choice="required",
                  max_tokens=80, reasoning=BUDGET)
    if "tools" in family(vision_family).unsupported:
        assert "tools" in refused(forced, "tools")
        assert "tools" in refused(chat(zoo_daemon, vision_family, messages, tools=TOOLS), "tools")
        return
    choice = ok(forced)
    [call] = choice["message"]["tool_calls"]
    schemas = {"get_weather": WEATHER, "note": NOTE}
    jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
    assert choice["finish_reason"] == "tool_calls"
    # The template renders the tools: the prompt is longer with them.
    plain = ok_usage(chat(zoo_daemon, vision_family, messages, max_tokens=1))
    with_tools = ok_usage(chat(zoo_daemon, vision_family, messages, tools=TOOLS, max_tokens=1))
    assert with_tools > plain


def ok_usage(reply) -> int:
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens"]
