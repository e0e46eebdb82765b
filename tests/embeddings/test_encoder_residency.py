"""An embedding model is an ordinary resident: under a budget too small for
it beside a pinned chat model, or beside a chat model with a stream in
flight, an embedding request never evicts the chat model; it gets a 503 and
the chat model stays loaded."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from mlxd.registry.loader import load_registry
from support.daemon import daemon_in_thread, tiny_model, wait_until, write_registry

pytestmark = pytest.mark.mlx


def _registry(tmp: Path, embedder: Path, *, pinned: bool, budget: int | None = None) -> Path:
    return write_registry(tmp, [
        {"name": "chat", "model": "qwen", "pinned": pinned, "preload": True, "max_context": 512,
         "prefix_cache": {"max_bytes": 0}},
        {"name": "embed", "path": str(embedder), "kind": "embedding", "batch_tokens": 1024},
    ], manager={"memory_budget": budget or "2GB", "contention_policy": {"strategy": "fail"}})


def _tight_budget(tmp: Path, embedder: Path) -> int:
    """Room for either model, not for both."""
    registry = load_registry(_registry(tmp / "sizing", embedder, pinned=False))
    chat, embed = registry.lookup("chat"), registry.lookup("embed")
    assert chat is not None and embed is not None
    big, small = sorted((chat.charge_bytes, embed.charge_bytes), reverse=True)
    return big + small // 2


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned chat", "busy chat"])
def test_an_embedding_request_never_evicts_the_chat_model(tmp_path, tiny_embedder, pinned) -> None:
    tiny_model("qwen")
    (tmp_path / "sizing").mkdir()
    registry = _registry(tmp_path, tiny_embedder, pinned=pinned, budget=_tight_budget(tmp_path, tiny_embedder))
    with daemon_in_thread(registry, tmp_path) as daemon:
        wait_until(lambda: daemon.model("chat")["state"] == "loaded", timeout=60)
        streaming = threading.Event()
        done: list[int] = []

        def chat_stream() -> None:
            body = {"model": "chat", "prompt": "def parse_arguments(argv):", "max_tokens": 400,
                    "ignore_eos": True, "stream": True}
            with httpx.stream("POST", daemon.url + "/v1/completions", json=body, timeout=120) as answer:
                for line in answer.iter_lines():
                    if line.startswith("data: {"):
                        streaming.set()
                done.append(answer.status_code)

        stream = threading.Thread(target=chat_stream)
        if not pinned:
            stream.start()
            assert streaming.wait(60)
        answer = httpx.post(daemon.url + "/v1/embeddings", json={"model": "embed", "input": "hello"}, timeout=60)
        assert answer.status_code == 503, answer.text
        assert daemon.model("chat")["state"] == "loaded"
        assert daemon.model("embed")["state"] != "loaded"
        if not pinned:
            stream.join(120)
            assert done == [200]
