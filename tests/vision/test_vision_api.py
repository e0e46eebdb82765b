"""Vision end to end: a real daemon, the real tiny vision model built by the
factory, the official openai client, images as data:, file:// and loopback
http URLs."""

from __future__ import annotations

import httpx
import openai
import pytest
from support.daemon import daemon_in_thread, wait_until, write_registry
from vision.vision_support import PROMPT, Route, data_url, encoded, image_chat, loopback_server, noise_image, solid_image

pytestmark = pytest.mark.mlx

TEXT_CHAT = [{"role": "user", "content": "Read the configuration file and report the options"}]
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("allowed-images")
    (folder / "noise.png").write_bytes(encoded(noise_image()))
    (folder.parent / "private.png").write_bytes(encoded(noise_image()))
    return folder


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, vision_tiny, images_dir):
    tmp = tmp_path_factory.mktemp("vision-api")
    registry = write_registry(
        tmp,
        [
            {"name": "eyes", "path": str(vision_tiny), "local_image_dir": str(images_dir), "max_concurrency": 2},
            {"name": "eyes-web", "path": str(vision_tiny), "allow_remote_images": True},
            {"name": "eyes-small", "path": str(vision_tiny), "max_context": 256},
            {"name": "words", "model": "qwen"},
        ],
    )
    with daemon_in_thread(registry, tmp) as d:
        yield d


@pytest.fixture
def client(daemon):
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


def answer(client, messages, model: str = "eyes", **kw):
    return client.chat.completions.create(model=model, messages=messages, **{**GREEDY, **kw})


def text_of(reply) -> str:
    return reply.choices[0].message.content


def error_of(response: httpx.Response) -> dict:
    assert response.status_code == 400, response.text
    assert "Traceback" not in response.text
    return response.json()["error"]


def post_chat(daemon, messages, model: str = "eyes") -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions", json={"model": model, "messages": messages, **GREEDY}, timeout=60
    )


def test_an_image_question_gets_a_completion_with_usage(client):
    reply = answer(client, image_chat(data_url(noise_image())))
    text_only = answer(client, [{"role": "user", "content": PROMPT}])
    assert reply.model == "eyes"
    assert text_of(reply)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    # The image's tokens are part of the prompt.
    assert reply.usage.prompt_tokens > text_only.usage.prompt_tokens + 3


def test_greedy_output_is_deterministic_and_depends_on_the_image(client):
    noise = text_of(answer(client, image_chat(data_url(noise_image()))))
    again = text_of(answer(client, image_chat(data_url(noise_image()))))
    red = text_of(answer(client, image_chat(data_url(solid_image()))))
    jpeg = text_of(answer(client, image_chat(data_url(solid_image(), "JPEG"))))
    assert noise == again
    assert noise != red
    assert jpeg  # another format decodes too (its pixels differ slightly from the PNG's)


def test_streaming_gives_the_same_answer_as_non_streaming(client):
    messages = image_chat(data_url(noise_image()))
    whole = answer(client, messages)
    chunks = list(
        answer(client, messages, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text_of(whole)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 12


def test_text_only_chat_to_a_vision_model_works(client):
    reply = answer(client, TEXT_CHAT)
    assert text_of(reply) and reply.usage.completion_tokens == 12


def test_an_image_for_a_text_model_is_a_400(daemon):
    error = error_of(post_chat(daemon, image_chat(data_url(solid_image())), model="words"))
    assert error["param"] == "messages"
    assert "does not accept images" in error["message"]


def test_bad_image_data_is_a_400_naming_the_message(daemon):
    messages = [{"role": "system", "content": "Be brief."}, *image_chat("data:image/png;base64,@@@not-base64@@@")]
    error = error_of(post_chat(daemon, messages))
    assert error["param"] == "messages[1].content[1]"
    assert "base64" in error["message"]


def test_not_an_image_is_a_400_also_when_streaming(daemon):
    body = {
        "model": "eyes", "stream": True, **GREEDY,
        "messages": image_chat("data:image/png;base64,aGVsbG8gd29ybGQ="),
    }
    error = error_of(httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=60))
    assert error["param"] == "messages[0].content[1]"
    assert "PNG, JPEG or WebP" in error["message"]


def test_a_streamed_prompt_past_max_context_is_a_400_not_an_error_inside_a_200(daemon):
    # Within the cheap character bound, past the tokenized one (images included).
    messages = image_chat(data_url(noise_image()), "describe " * 400)
    body = {"model": "eyes-small", "messages": messages, "stream": True, **GREEDY}
    response = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=120)
    assert error_of(response)["code"] == "context_length_exceeded"
    assert "images included" in response.json()["error"]["message"]


def test_a_file_under_local_image_dir_is_read(client, images_dir):
    from_file = text_of(answer(client, image_chat((images_dir / "noise.png").as_uri())))
    inline = text_of(answer(client, image_chat(data_url(noise_image()))))
    assert from_file == inline


def test_a_file_outside_local_image_dir_is_a_400(daemon, images_dir):
    error = error_of(post_chat(daemon, image_chat((images_dir.parent / "private.png").as_uri())))
    assert error["param"] == "messages[0].content[1]"
    assert "outside the folder" in error["message"]
    # A model without local_image_dir reads no files at all.
    error = error_of(post_chat(daemon, image_chat((images_dir / "noise.png").as_uri()), model="eyes-web"))
    assert "local_image_dir" in error["message"]


def test_remote_urls_need_allow_remote_images(daemon, client):
    with loopback_server({"/noise.png": Route(encoded(noise_image()))}) as server:
        error = error_of(post_chat(daemon, image_chat(f"{server.url}/noise.png")))
        assert server.hits == []
        fetched = text_of(answer(client, image_chat(f"{server.url}/noise.png"), model="eyes-web"))
        assert server.hits == ["/noise.png"]
    assert "allow_remote_images: true" in error["message"]
    assert error["param"] == "messages[0].content[1]"
    assert fetched == text_of(answer(client, image_chat(data_url(noise_image()))))


def test_the_vision_model_loads_and_unloads_through_residency(daemon, client):
    def mlx_active() -> int:
        return daemon.status()["memory"]["mlx"]["active_bytes"]

    assert httpx.post(f"{daemon.url}/v1/models/eyes/unload", json={}, timeout=60).json()["state"] == "unloaded"
    unloaded = mlx_active()
    # A bad image is refused before any lease: it does not load the model.
    error_of(post_chat(daemon, image_chat("data:image/png;base64,aGVsbG8=")))
    assert daemon.model("eyes")["state"] == "unloaded"

    loads_before = daemon.model("eyes")["load_count"]
    assert text_of(answer(client, image_chat(data_url(noise_image()))))
    status = daemon.model("eyes")
    assert status["state"] == "loaded" and status["kind"] == "vision"
    assert status["load_count"] == loads_before + 1
    load_bytes = status["engine"]["load_bytes"]
    assert load_bytes > 1_000_000
    assert status["memory"]["measured_bytes"] >= load_bytes
    assert mlx_active() - unloaded >= load_bytes

    assert httpx.post(f"{daemon.url}/v1/models/eyes/unload", json={}, timeout=60).json()["state"] == "unloaded"
    wait_until(lambda: daemon.model("eyes")["state"] == "unloaded")
    assert mlx_active() - unloaded < load_bytes * 0.05
    listing = {m["id"]: m for m in httpx.get(f"{daemon.url}/v1/models").json()["data"]}
    assert listing["eyes"]["kind"] == "vision" and listing["eyes"]["state"] == "unloaded"
