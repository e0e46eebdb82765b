"""Image parts of chat messages: the per-model rules and decoding (no MLX)."""

from __future__ import annotations

import asyncio
import base64
import threading
from pathlib import Path

import pytest
from vision.vision_support import Route, data_url, encoded, image_chat, loopback_server, noise_image, solid_image

from mlxd.api.images import ImageLimits, ImagePolicy, collect_images
from mlxd.api.openai.bodies import ChatCompletionRequest
from mlxd.errors import BadRequest


def convo(messages):
    """OpenAI chat messages as the conversation the image checks read."""
    return ChatCompletionRequest(model="eyes", messages=messages).conversation()


def policy(**kw) -> ImagePolicy:
    return ImagePolicy(model="eyes", **kw)


def load(messages, rules: ImagePolicy):
    return asyncio.run(collect_images(convo(messages), rules).load())


def rejected(messages, rules: ImagePolicy) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        load(messages, rules)
    assert err.value.status_code == 400
    return err.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_data_urls_decode_to_rgb_images_of_the_sent_size(fmt):
    [image] = load(image_chat(data_url(noise_image(size=(40, 24)), fmt)), policy())
    assert image.mode == "RGB"
    assert image.size == (40, 24)


def test_images_come_back_in_message_order():
    messages = [
        {"role": "system", "content": "You look at pictures."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(solid_image(size=(8, 8)))}}]},
        {"role": "assistant", "content": "A square."},
        *image_chat(data_url(solid_image(size=(16, 4)))),
    ]
    images = load(messages, policy())
    assert [i.size for i in images] == [(8, 8), (16, 4)]


def test_the_responses_api_shape_with_a_plain_string_url_is_accepted():
    part = {"type": "input_image", "image_url": data_url(solid_image(size=(9, 9)))}
    [image] = load([{"role": "user", "content": [part]}], policy())
    assert image.size == (9, 9)


def test_bad_base64_names_the_message_and_part():
    messages = [{"role": "system", "content": "hi"}, *image_chat("data:image/png;base64,not*base64!")]
    err = rejected(messages, policy())
    assert err.param == "messages[1].content[1]"
    assert "base64" in err.message


def padded_png() -> tuple[bytes, str]:
    """A PNG whose base64 ends in padding, and that base64."""
    raw = next(r for r in (encoded(noise_image(size=(9, 9 + i))) for i in range(6)) if len(r) % 3)
    return raw, base64.b64encode(raw).decode()


def test_base64_without_its_padding_is_the_same_image():
    _, text = padded_png()
    assert text.endswith("=")
    [whole] = load(image_chat(f"data:image/png;base64,{text}"), policy())
    [unpadded] = load(image_chat(f"data:image/png;base64,{text.rstrip('=')}"), policy())
    assert unpadded.size == whole.size and unpadded.tobytes() == whole.tobytes()


@pytest.mark.parametrize("mangle", [
    lambda text: text + "*",  # not a base64 character
    lambda text: text + "A" * ((1 - len(text)) % 4),  # a length no padding makes whole
    lambda text: text[:4] + "=" + text[4:],  # padding inside the data
])
def test_base64_that_no_padding_mends_is_still_refused(mangle):
    _, text = padded_png()
    err = rejected(image_chat(f"data:image/png;base64,{mangle(text.rstrip('='))}"), policy())
    assert "not valid base64" in err.message


def test_bytes_that_are_not_an_image_are_rejected():
    url = "data:image/png;base64," + base64.b64encode(b"just some text, no pixels").decode()
    err = rejected(image_chat(url), policy())
    assert err.param == "messages[0].content[1]"
    assert "PNG, JPEG or WebP" in err.message


def test_a_truncated_image_is_rejected():
    whole = encoded(noise_image(size=(64, 64)))
    url = "data:image/png;base64," + base64.b64encode(whole[: len(whole) // 2]).decode()
    err = rejected(image_chat(url), policy())
    assert "truncated or corrupt" in err.message


def test_other_formats_are_refused_even_when_pillow_could_read_them():
    gif = encoded(solid_image(), "GIF")
    err = rejected(image_chat("data:image/png;base64," + base64.b64encode(gif).decode()), policy())
    assert "PNG, JPEG or WebP" in err.message
    with pytest.raises(BadRequest, match="image/gif"):
        collect_images(convo(image_chat("data:image/gif;base64," + base64.b64encode(gif).decode())), policy())


def test_a_data_url_that_is_not_base64_is_refused_while_planning():
    with pytest.raises(BadRequest, match="base64 encoded"):
        collect_images(convo(image_chat("data:image/png,rawbytes")), policy())


def test_limits_on_bytes_pixels_and_count():
    tiny = ImageLimits(max_bytes=1000, max_pixels=100, max_images=2)
    big = data_url(noise_image(size=(64, 64)))
    with pytest.raises(BadRequest, match="larger than"):
        collect_images(convo(image_chat(big)), policy(limits=tiny))
    err = rejected(image_chat(data_url(solid_image(size=(20, 20)))), policy(limits=tiny))
    assert "20x20" in err.message
    small = data_url(solid_image(size=(2, 2)))
    three = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": small}}] * 3}]
    with pytest.raises(BadRequest, match="At most 2 images"):
        collect_images(convo(three), policy(limits=tiny))


def test_images_outside_user_messages_are_refused():
    messages = [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": data_url(solid_image())}}]}]
    with pytest.raises(BadRequest, match="user messages only") as err:
        collect_images(convo(messages), policy())
    assert err.value.param == "messages[0].content[0]"


def test_image_payloads_are_dropped_from_the_messages_the_engine_sees():
    messages = image_chat(data_url(solid_image()))
    stripped = convo(messages).template_messages()
    assert stripped[0]["content"] == [{"type": "text", "text": "Describe the picture"}, {"type": "image"}]
    assert messages[0]["content"][1]["type"] == "image_url"  # the request's own copy is untouched


# --- local files ----------------------------------------------------------------


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "allowed"
    folder.mkdir()
    (folder / "red.png").write_bytes(encoded(solid_image(size=(12, 10))))
    (tmp_path / "secret.png").write_bytes(encoded(solid_image(size=(5, 5))))
    return folder


def test_a_file_under_local_image_dir_is_read(image_dir: Path):
    [image] = load(image_chat((image_dir / "red.png").as_uri()), policy(local_dir=image_dir))
    assert image.size == (12, 10)


def test_file_urls_without_local_image_dir_are_refused(image_dir: Path):
    with pytest.raises(BadRequest, match="local_image_dir") as err:
        collect_images(convo(image_chat((image_dir / "red.png").as_uri())), policy())
    assert err.value.param == "messages[0].content[1]"


@pytest.mark.parametrize("how", ["outside", "dot-dot", "symlink"])
def test_a_file_outside_the_folder_is_refused(image_dir: Path, how: str):
    if how == "outside":
        url = (image_dir.parent / "secret.png").as_uri()
    elif how == "dot-dot":
        url = f"file://{image_dir}/../secret.png"
    else:
        (image_dir / "link.png").symlink_to(image_dir.parent / "secret.png")
        url = (image_dir / "link.png").as_uri()
    with pytest.raises(BadRequest, match="outside the folder") as err:
        collect_images(convo(image_chat(url)), policy(local_dir=image_dir))
    assert err.value.param == "messages[0].content[1]"
    assert str(image_dir) not in err.value.message


def test_a_missing_file_under_the_folder_is_a_bad_request(image_dir: Path):
    err = rejected(image_chat((image_dir / "nope.png").as_uri()), policy(local_dir=image_dir))
    assert "no image file" in err.message


@pytest.mark.parametrize("url", ["file://host/red.png", "file:red.png"])
def test_file_urls_must_name_an_absolute_local_path(image_dir: Path, url: str):
    with pytest.raises(BadRequest, match="must name a local file"):
        collect_images(convo(image_chat(url)), policy(local_dir=image_dir))


def test_unknown_url_schemes_are_refused():
    with pytest.raises(BadRequest, match="Unsupported image URL"):
        collect_images(convo(image_chat("ftp://example.invalid/a.png")), policy())


# --- remote URLs (a loopback server only) ----------------------------------------


def test_remote_urls_are_refused_unless_the_model_allows_them():
    with loopback_server({"/red.png": Route(encoded(solid_image()))}) as server:
        with pytest.raises(BadRequest) as err:
            collect_images(convo(image_chat(f"{server.url}/red.png")), policy())
        assert server.hits == []
    assert "allow_remote_images: true" in err.value.message
    assert "data:" in err.value.message
    assert err.value.param == "messages[0].content[1]"


def test_an_allowed_remote_image_is_fetched():
    with loopback_server({"/red.png": Route(encoded(solid_image(size=(7, 3))))}) as server:
        [image] = load(image_chat(f"{server.url}/red.png"), policy(allow_remote=True))
        assert server.hits == ["/red.png"]
    assert image.size == (7, 3)


def test_remote_failures_are_bad_requests_with_the_status():
    with loopback_server({}) as server:
        err = rejected(image_chat(f"{server.url}/missing.png"), policy(allow_remote=True))
    assert "HTTP 404" in err.message


def test_a_remote_image_over_the_size_cap_is_refused():
    body = encoded(noise_image(size=(64, 64)))
    with loopback_server({"/big.png": Route(body)}) as server:
        rules = policy(allow_remote=True, limits=ImageLimits(max_bytes=len(body) - 1))
        err = rejected(image_chat(f"{server.url}/big.png"), rules)
    assert "larger than" in err.message


def test_a_remote_server_that_never_answers_times_out():
    hold = threading.Event()
    with loopback_server({"/hang.png": Route(encoded(solid_image()), hold=hold)}) as server:
        rules = policy(allow_remote=True, limits=ImageLimits(fetch_timeout_s=0.3))
        err = rejected(image_chat(f"{server.url}/hang.png"), rules)
    assert "longer than 0.3 s" in err.message


def test_an_unreachable_remote_server_is_a_bad_request():
    with loopback_server({}) as server:
        url = f"{server.url}/gone.png"
    # The server is shut down: nothing listens on that loopback port now.
    err = rejected(image_chat(url), policy(allow_remote=True))
    assert "could not be reached" in err.message
