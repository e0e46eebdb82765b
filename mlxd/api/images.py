"""Images in chat messages: where they may come from, and reading them.

Two steps, so that nothing slow runs on the event loop:

- ``collect_images(conversation, policy)`` runs while the request is planned. It
  looks at every image part without any I/O, applies the model's rules
  (``data:`` URLs always; ``file://`` only under ``local_image_dir``; http(s)
  only with ``allow_remote_images``) and raises a 400 naming the part.
- ``PendingImages.read()`` runs just before a lease is taken: it decodes
  base64 and reads files in a thread, fetches remote URLs with httpx under a
  size cap and a deadline, and reads each image's header (format, size), so
  a bad image is a 400 that never loads a model or holds a slot.
- ``PendingImages.decode(memory)`` runs once the lease is held: it decodes
  every image with Pillow (PNG, JPEG and WebP only) into an RGB
  ``PIL.Image``, no larger than the model's image processor will use, under
  the daemon-wide bound on decoded pixels (``ImageMemory``). A 160 KB PNG can
  hold 7000x7000 pixels (147 MB of RGB): decoding only after admission, and
  only as many at once as that bound allows, keeps a burst of them from
  taking gigabytes before the queue limits apply.

Every failure is a ``BadRequest`` whose ``param`` names the part where the
client's request had it (``messages[1].content[0]``); exception text from
Pillow or httpx never reaches the client.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import json
import logging
import math
from collections.abc import AsyncIterator
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
class DecodeTarget:
    """The least an image must keep for the model's image processor: it
    resizes every image itself, so decoding more than this only costs memory.
    An image is reduced by a whole factor while both bounds still hold."""

    min_side: int | None = None
    min_pixels: int | None = None

    # Without a processor config: Qwen2-VL's default max_pixels (3584 x 3584).
    FALLBACK_PIXELS = 12_845_056

    @classmethod
    def for_model_folder(cls, folder: Path | None) -> DecodeTarget:
        """From ``preprocessor_config.json``: ``max_pixels`` (Qwen2-VL and
        kin), ``size`` ({height, width}, {shortest_edge}) or ``image_size``."""
        config: dict[str, Any] = {}
        if folder is not None:
            with contextlib.suppress(OSError, ValueError):
                config = json.loads((folder / "preprocessor_config.json").read_text())
        size = config.get("size")
        if isinstance(config.get("max_pixels"), int):
            return cls(min_pixels=config["max_pixels"])
        if isinstance(size, dict):
            if isinstance(size.get("max_pixels"), int):
                return cls(min_pixels=size["max_pixels"])
            sides = [v for k, v in size.items() if k in ("height", "width", "shortest_edge", "longest_edge")]
            if sides and all(isinstance(v, int) for v in sides):
                return cls(min_side=max(sides))
        if isinstance(size, int):
            return cls(min_side=size)
        if isinstance(config.get("image_size"), int):
            return cls(min_side=config["image_size"])
        return cls(min_pixels=cls.FALLBACK_PIXELS)

    def factor(self, width: int, height: int) -> int:
        """The largest whole reduction that keeps both bounds (1: none)."""
        bounds = []
        if self.min_side:
            bounds.append(min(width, height) // self.min_side)
        if self.min_pixels:
            bounds.append(math.isqrt(width * height // self.min_pixels))
        return max(1, min(bounds)) if bounds else 1


class ImageMemory:
    """A bound on decoded image bytes held at once, across every request.

    One lives in the daemon's context; each decode reserves what its image
    will take (file pixels plus the RGB copy) and waits while the rest of the
    bound is in use.
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0
        self.peak = 0
        self._freed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int, param: str) -> AsyncIterator[None]:
        if nbytes > self.limit:
            raise BadRequest(
                f"Decoding the image would take {format_bytes(nbytes)}, more than this server allows "
                f"({format_bytes(self.limit)}, server.max_image_memory); send a smaller image.",
                param=param,
            )
        async with self._freed:
            await self._freed.wait_for(lambda: self.used + nbytes <= self.limit)
            self.used += nbytes
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            async with self._freed:
                self.used -= nbytes
                self._freed.notify_all()


@dataclass(frozen=True)
class ImagePolicy:
    """Where one model may take images from (its models.yaml entry)."""

    model: str
    local_dir: Path | None = None
    allow_remote: bool = False
    limits: ImageLimits = field(default_factory=ImageLimits)
    # The model's folder, for its image processor's size (``DecodeTarget``).
    model_dir: Path | None = None

    @classmethod
    def for_model(cls, spec: ModelSpec, limits: ImageLimits | None = None) -> ImagePolicy:
        return cls(
            model=spec.name,
            local_dir=spec.local_image_dir.resolve() if spec.local_image_dir else None,
            allow_remote=spec.allow_remote_images,
            limits=limits or ImageLimits(),
            # A remote entry has no folder here: its backend sizes the images.
            model_dir=None if spec.is_remote else spec.path,
        )


@dataclass(frozen=True)
class ImageSource:
    """One image part, checked against the policy but not read yet."""

    param: str
    kind: str  # "data" | "file" | "remote"
    # base64 text for "data", a resolved path for "file", the URL for "remote".
    location: str | Path


@dataclass(frozen=True)
class ReadImage:
    """An image's bytes with its header checked, not decoded yet."""

    param: str
    raw: bytes
    # What decoding will hold at its peak, in bytes.
    decode_bytes: int
    # Pillow's name for the format the header declares (one of IMAGE_FORMATS).
    format: str = "PNG"

    def data_url(self) -> str:
        return f"data:image/{self.format.lower()};base64,{base64.b64encode(self.raw).decode('ascii')}"


@dataclass
class PendingImages:
    sources: list[ImageSource]
    limits: ImageLimits
    model_dir: Path | None = None
    read_images: list[ReadImage] = field(default_factory=list)
    target: DecodeTarget = field(default_factory=DecodeTarget)

    async def read(self) -> None:
        """Fetch every image's bytes and check its header; no decoding."""
        client = _http_client(self.limits) if any(s.kind == "remote" for s in self.sources) else None
        self.target = await asyncio.to_thread(DecodeTarget.for_model_folder, self.model_dir)
        try:
            for source in self.sources:
                raw = await _read(source, self.limits, client)
                cost, kind = await asyncio.to_thread(probe_image, raw, source.param, self.limits, self.target)
                self.read_images.append(ReadImage(source.param, raw, cost, kind))
        finally:
            if client is not None:
                await client.aclose()

    async def decode(self, memory: ImageMemory) -> list[Any]:
        """The decoded images (``PIL.Image``, RGB), in message order."""
        images = []
        for item in self.read_images:
            async with memory.hold(item.decode_bytes, item.param):
                images.append(await asyncio.to_thread(decode_image, item.raw, item.param, self.limits, self.target))
        return images

    def data_urls(self) -> list[str]:
        """The images as ``data:`` URLs, in message order, for a backend to
        decode (checked here, never decoded: that memory is the backend's)."""
        return [item.data_url() for item in self.read_images]

    async def load(self) -> list[Any]:
        """Read and decode in one go, bounded by nothing but the limits."""
        await self.read()
        return await self.decode(ImageMemory(1 << 62))


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
    return PendingImages(sources, policy.limits, policy.model_dir)


def probe_image(raw: bytes, param: str, limits: ImageLimits, target: DecodeTarget) -> tuple[int, str]:
    """Check the header (format, pixel count) without decoding; return the
    bytes decoding will hold at its peak, and the format."""
    with _opened(raw, param, limits, target) as image:
        # The file's own pixels, then the RGB copy convert() makes.
        return image.size[0] * image.size[1] * (len(image.getbands()) + 3), str(image.format)


def decode_image(raw: bytes, param: str, limits: ImageLimits, target: DecodeTarget | None = None) -> Any:
    """Bytes -> an RGB ``PIL.Image``, reduced to what ``target`` needs; a 400
    for anything else."""
    target = target or DecodeTarget()
    with _opened(raw, param, limits, target) as image:
        rgb = image.convert("RGB")
    factor = target.factor(*rgb.size)
    return rgb.reduce(factor) if factor > 1 else rgb


@contextlib.contextmanager
def _opened(raw: bytes, param: str, limits: ImageLimits, target: DecodeTarget) -> Any:
    """The image opened (header read, pixels not decoded), JPEGs set to
    decode at the smallest scale ``target`` allows; Pillow's errors become 400s."""
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
            factor = target.factor(width, height)
            if factor > 1 and image.format == "JPEG":
                # libjpeg decodes straight at 1/2, 1/4 or 1/8 scale: the full
                # size never exists in memory.
                image.draft("RGB", (math.ceil(width / factor), math.ceil(height / factor)))
            yield image
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
    text = "".join(payload.split())
    try:
        # Many clients leave the trailing "=" off; the data is the same.
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
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
