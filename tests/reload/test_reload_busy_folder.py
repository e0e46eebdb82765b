"""Hot reload as a user runs it: `mlxd serve --config ./models.yaml > ./daemon.log`,
so the daemon's own log grows in the registry's folder, next to a file another
program keeps rewriting (a busy home directory). Only the registry matters."""

import threading
import time

import httpx
import pytest
from support.daemon import daemon_process, wait_until, write_registry

pytestmark = pytest.mark.mlx


def _busy(folder, stop: threading.Event) -> None:
    neighbour = folder / "notes.txt"
    n = 0
    while not stop.is_set():
        n += 1
        neighbour.write_text(f"edit {n}\n")
        time.sleep(0.03)


def _names(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{url}/v1/status", timeout=10).json()["models"]]


def _config(url: str) -> dict:
    return httpx.get(f"{url}/v1/status", timeout=10).json()["config"]


def test_reload_applies_with_the_log_and_a_busy_neighbour_in_the_same_folder(tmp_path):
    registry = write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
    stop = threading.Event()
    writer = threading.Thread(target=_busy, args=(tmp_path, stop), daemon=True)
    with daemon_process(registry, tmp_path) as d:
        assert d.log_path.parent == registry.parent
        wait_until(lambda: "watching" in d.log(), timeout=30)
        writer.start()
        try:
            time.sleep(1.0)  # let the folder get busy before the edit

            write_registry(tmp_path, [{"name": "a", "model": "qwen"}, {"name": "b", "model": "llama"}])
            wait_until(lambda: "b" in _names(d.url), timeout=20)
            body = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            assert httpx.post(f"{d.url}/v1/chat/completions", json=body, timeout=60).status_code == 200

            write_registry(tmp_path, [{"name": "a", "model": "qwen"}, {"name": "b", "model": "llama"},
                                      {"name": "c", "pth": "nowhere"}])
            error = wait_until(lambda: _config(d.url)["error"], timeout=20)
            assert error["file"] == str(registry) and error["line"] is not None
            assert "pth" in error["message"]

            write_registry(tmp_path, [{"name": "a", "model": "qwen"}])
            wait_until(lambda: _names(d.url) == ["a"], timeout=20)
            assert _config(d.url)["error"] is None
        finally:
            stop.set()
            writer.join()
        # watchfiles' own "N changes detected" lines would feed the folder forever.
        assert "change detected" not in d.log() and "changes detected" not in d.log()
