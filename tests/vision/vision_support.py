"""Helpers shared by the vision tests (imported as ``vision.vision_support``):
deterministic test images, data URLs, and a loopback HTTP server that serves
images to the daemon (never an outside address)."""

from __future__ import annotations

import base64
import contextlib
import io
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from mlxd.factory.vision import VisionRecipe, build_vision_model

TINY_VISION = VisionRecipe(size="tiny", seed=0)
PROMPT = "Describe the picture"


def tiny_vision_model() -> Path:
    return build_vision_model(TINY_VISION)


def noise_image(seed: int = 1, size: tuple[int, int] = (80, 64)) -> Any:
    import numpy as np
    from PIL import Image

    width, height = size
    pixels = np.random.RandomState(seed).randint(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def solid_image(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (64, 64)) -> Any:
    from PIL import Image

    return Image.new("RGB", size, color)


def encoded(image: Any, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def data_url(image: Any, fmt: str = "PNG") -> str:
    media = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}[fmt]
    return f"data:{media};base64,{base64.b64encode(encoded(image, fmt)).decode()}"


def image_chat(url: str, text: str = PROMPT) -> list[dict[str, Any]]:
    """One user message: the text, then the image."""
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    content_type: str = "image/png"
    # When set, the handler waits for it before answering (a server that hangs).
    hold: threading.Event | None = None


@dataclass
class LoopbackServer:
    url: str
    routes: dict[str, Route] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)


@contextlib.contextmanager
def loopback_server(routes: dict[str, Route]) -> Iterator[LoopbackServer]:
    """An HTTP server on 127.0.0.1 serving ``routes``; every held request is
    released when the block ends."""
    state = LoopbackServer(url="", routes=dict(routes))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            state.hits.append(self.path)
            route = state.routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            if route.hold is not None:
                route.hold.wait(30)
            self.send_response(route.status)
            self.send_header("Content-Type", route.content_type)
            self.send_header("Content-Length", str(len(route.body)))
            self.end_headers()
            self.wfile.write(route.body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="loopback-images", daemon=True
    )
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        for route in state.routes.values():
            if route.hold is not None:
                route.hold.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
