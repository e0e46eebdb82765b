"""Images in chat messages: where they may come from, and reading them.

Two steps, so that nothing slow runs on the event loop:

- ``collect_images(conversation, policy)`` runs while the request is planned. It
  looks at every image part without any I/O, applies the model's rules
  (``data:`` URLs always; ``file://`` only under ``local_image_dir``; http(s)
  only with ``allow_remote_images``) and raises a 400 naming the part.
- ``PendingImages.load()`` runs just before a lease is taken: it decodes
  base64 and reads files in a thread, fetches remote URLs with httpx under a
  size cap and a deadline, and decodes every image with Pillow (PNG, JPEG and
  WebP only) into an RGB ``PIL.Image``.

Every failure is a ``BadRequest`` whose ``param`` names the part where the
client's request had it (``messages[1].content[0]``); exception text from
Pillow or httpx never reaches the client.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from mlxd.api.conversation import Conversation, ImagePart
from mlxd.errors import BadRequest, describe_exception
from mlxd.registry.model import ModelSpec
from mlxd.registry.sizing import format_bytes

# What Pillow may decode: the formats clients send, nothing with a history of
# parser bugs (no TIFF, PSD, EPS...).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
_FORMAT_NAMES = "PNG, JPEG or WebP"
_DATA_MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageLimits:
    # OpenAI's own per-image limit.
    max_bytes: int = 20 << 20
    # Below Pillow's decompression-bomb threshold (89 M), so we refuse first.
    max_pixels: int = 50_000_000
    max_images: int = 16
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3


@dataclass(frozen=True)
class ImagePolicy:
    """Where one model may take images from (its models.yaml entry)."""

    model: str
    local_dir: Path | None = None
    allow_remote: bool = False
    limits: ImageLimits = field(default_factory=ImageLimits)

    @classmethod
    def for_model(cls, spec: ModelSpec, limits: ImageLimits | None = None) -> ImagePolicy:
        return cls(
            model=spec.name,
            local_dir=spec.local_image_dir.resolve() if spec.local_image_dir else None,
            allow_remote=spec.allow_remote_images,
            limits=limits or ImageLimits(),
        )


@dataclass(frozen=True)
class ImageSource:
    """One image part, checked against the policy but not read yet."""

    param: str
    kind: str  # "data" | "file" | "remote"
    # base64 text for "data", a resolved path for "file", the URL for "remote".
    location: str | Path


@dataclass
class PendingImages:
    sources: list[ImageSource]
    limits: ImageLimits

    async def load(self) -> list[Any]:
        """The decoded images (``PIL.Image``, RGB), in message order."""
        images = []
        client = _http_client(self.limits) if any(s.kind == "remote" for s in self.sources) else None
        try:
            for source in self.sources:
                raw = await _read(source, self.limits, client)
                images.append(await asyncio.to_thread(decode_image, raw, source.param, self.limits))
        finally:
            if client is not None:
                await client.aclose()
        return images


def collect_images(conversation: Conversation, policy: ImagePolicy) -> PendingImages:
    """Check every image part of ``conversation`` against ``policy``; no I/O."""
    sources = []
    for message in conversation.messages:
        for part in message.images():
            if message.role != "user":
                raise BadRequest("Images are accepted in user messages only.", param=part.param)
            sources.append(_source(_url_of(part), part.param, policy))
    if len(sources) > policy.limits.max_images:
        raise BadRequest(
            f"At most {policy.limits.max_images} images per request; this one has {len(sources)}.",
            param="messages",
        )
    return PendingImages(sources, policy.limits)


def decode_image(raw: bytes, param: str, limits: ImageLimits) -> Any:
    """Bytes -> an RGB ``PIL.Image``; a 400 for anything else."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS) as image:
            width, height = image.size
            if width * height > limits.max_pixels:
                raise BadRequest(
                    f"The image is {width}x{height} pixels; the limit is "
                    f"{limits.max_pixels:,} pixels.",
                    param=param,
                )
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise BadRequest(f"The image is not a {_FORMAT_NAMES} image.", param=param) from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        log.info("image at %s does not decode: %s", param, describe_exception(exc))
        raise BadRequest("The image data is truncated or corrupt.", param=param) from None


# --- checking a part (no I/O) -------------------------------------------------


def _url_of(part: ImagePart) -> str:
    if part.url is None or not part.url.strip():
        raise BadRequest("The image part has no `image_url.url`.", param=part.param)
    return part.url.strip()


def _source(url: str, param: str, policy: ImagePolicy) -> ImageSource:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return ImageSource(param, "data", _data_payload(url, param, policy.limits))
    if scheme == "file":
        return ImageSource(param, "file", _local_path(url, param, policy))
    if scheme in ("http", "https"):
        if not policy.allow_remote:
            raise BadRequest(
                f"Remote image URLs are not allowed for model `{policy.model}`. Send the image "
                "inline as a data: URL (data:image/png;base64,...), or set "
                "`allow_remote_images: true` on the model in models.yaml.",
                param=param,
            )
        return ImageSource(param, "remote", url)
    raise BadRequest(
        "Unsupported image URL: use a data: URL (data:image/png;base64,...), a file:// URL "
        "under the model's local_image_dir, or http(s) where the model allows remote images.",
        param=param,
    )


def _data_payload(url: str, param: str, limits: ImageLimits) -> str:
    header, sep, payload = url.partition(",")
    media_type, *options = header[len("data:") :].split(";")
    if not sep or "base64" not in options:
        raise BadRequest("An image data: URL must be base64 encoded (data:image/png;base64,...).", param=param)
    if media_type.strip().lower() not in _DATA_MEDIA_TYPES:
        raise BadRequest(
            f"Unsupported image type `{media_type or 'none'}`; send image/png, image/jpeg or image/webp.",
            param=param,
        )
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise BadRequest(_too_large(limits), param=param)
    return payload


def _local_path(url: str, param: str, policy: ImagePolicy) -> Path:
    if policy.local_dir is None:
        raise BadRequest(
            f"Local image files are not allowed for model `{policy.model}`; send the image as a "
            "data: URL, or set `local_image_dir` on the model in models.yaml.",
            param=param,
        )
    parsed = urlparse(url)
    path = Path(unquote(parsed.path))
    if parsed.netloc not in ("", "localhost") or not path.is_absolute():
        raise BadRequest("A file:// URL must name a local file (file:///path/to/image.png).", param=param)
    # resolve() follows symlinks and "..": the check is on where the file really is.
    path = path.resolve()
    if not path.is_relative_to(policy.local_dir):
        raise BadRequest(
            f"The file is outside the folder model `{policy.model}` may read images from "
            "(its local_image_dir).",
            param=param,
        )
    return path


def _too_large(limits: ImageLimits) -> str:
    return f"The image is larger than {format_bytes(limits.max_bytes)}."


# --- reading (threads and httpx) ----------------------------------------------


async def _read(source: ImageSource, limits: ImageLimits, client: Any) -> bytes:
    if source.kind == "data":
        return await asyncio.to_thread(_decode_base64, str(source.location), source.param)
    if source.kind == "file":
        return await asyncio.to_thread(_read_file, Path(source.location), source.param, limits)
    try:
        return await asyncio.wait_for(
            _fetch(client, str(source.location), source.param, limits), limits.fetch_timeout_s
        )
    except asyncio.TimeoutError:
        raise BadRequest(
            f"Fetching the image took longer than {limits.fetch_timeout_s:g} s.", param=source.param
        ) from None


def _decode_base64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("The image data: URL is not valid base64.", param=param) from None


def _read_file(path: Path, param: str, limits: ImageLimits) -> bytes:
    try:
        if not path.is_file():
            raise BadRequest("There is no image file at that path.", param=param)
        if path.stat().st_size > limits.max_bytes:
            raise BadRequest(_too_large(limits), param=param)
        return path.read_bytes()
    except OSError:
        raise BadRequest("The image file cannot be read.", param=param) from None


def _http_client(limits: ImageLimits) -> Any:
    import httpx

    return httpx.AsyncClient(
        timeout=httpx.Timeout(limits.fetch_timeout_s),
        follow_redirects=True,
        max_redirects=limits.max_redirects,
    )


async def _fetch(client: Any, url: str, param: str, limits: ImageLimits) -> bytes:
    import httpx

    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise BadRequest(
                    f"Fetching the image failed: the server answered HTTP {response.status_code}.",
                    param=param,
                )
            declared = response.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > limits.max_bytes:
                raise BadRequest(_too_large(limits), param=param)
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece
                if len(body) > limits.max_bytes:
                    raise BadRequest(_too_large(limits), param=param)
            return bytes(body)
    except httpx.TooManyRedirects:
        raise BadRequest("Fetching the image failed: too many redirects.", param=param) from None
    except httpx.TimeoutException:
        raise BadRequest(
            f"Fetching the image took longer than {limits.fetch_timeout_s:g} s.", param=param
        ) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        log.info("fetching the image at %s failed: %s", param, describe_exception(exc))
        raise BadRequest("Fetching the image failed: the server could not be reached.", param=param) from None
