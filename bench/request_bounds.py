"""What small hostile requests cost the daemon: RSS, another model's stream
stall, file descriptors (issue 11, items 5, 6 and 8).

    python -m bench.request_bounds                 # this tree
    python -m bench.request_bounds --tree /path/to/other/checkout --label before

Each scenario runs against a fresh `mlxd serve` started from ``--tree`` (so
two checkouts compare on one machine):

- images: 6 concurrent requests, each a 7000x7000 PNG (~160 KB), to a vision
  model with max_concurrency 1, max_queue 1: peak RSS, and when the refusals
  (429) arrived;
- long prompt: a 5 MB chat prompt to one text model while another model
  streams: the longest gap between that stream's chunks, and RSS growth;
  near-bound prompt: the same with 120 000 characters, under the length
  bound (4096 x 32), so it is tokenized before its 400;
- big tools: one tool of 20,000 properties (~5 MB of JSON) on each surface
  (chat, Messages, count_tokens, Responses) of a model not loaded: status,
  seconds to the answer, RSS growth;
- slow clients: 300 sockets that send headers and 9 bytes of a 100 kB body:
  open file descriptors right after, and 40 s later.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench.common import RESULTS_DIR, ROOT, environment, free_port, save, stop, table

CHAT = [{"role": "user", "content": "Say hello"}]


@contextlib.contextmanager
def serve(tree: Path, models: list[dict[str, Any]], env: dict[str, str] | None = None) -> Iterator[tuple[str, psutil.Process]]:
    with tempfile.TemporaryDirectory(prefix="mlxd-bounds-") as tmp:
        registry = Path(tmp) / "models.yaml"
        registry.write_text(yaml.safe_dump({
            "manager": {"memory_budget": "8GB", "cache_dir": str(Path(tmp) / "cache")}, "models": models,
        }, sort_keys=False))
        port = free_port()
        full_env = {**os.environ, "MLXD_STATE_DIR": str(Path(tmp) / "state"), "PYTHONPATH": str(tree), **(env or {})}
        log = open(Path(tmp) / "daemon.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(port), "--no-watch"],
            stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=tree,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None:
                    raise RuntimeError((Path(tmp) / "daemon.log").read_text())
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("daemon did not start")
                time.sleep(0.1)
            # The serve command may re-exec itself (OpenBLAS): measure the server.
            yield url, psutil.Process(process.pid)
        finally:
            stop(process, signal.SIGTERM, 60)
            log.close()


def _wait_loaded(url: str, name: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        models = httpx.get(f"{url}/v1/status", timeout=10).json()["models"]
        if next(m for m in models if m["name"] == name)["state"] == "loaded":
            return
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not load")


class RssSampler:
    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, 0, threading.Event()
        self.start_rss = process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def png_bomb() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (7000, 7000), (200, 30, 30)).save(out, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def images(tree: Path) -> dict[str, Any]:
    from mlxd.factory.vision import VisionRecipe, build_vision_model

    path = build_vision_model(VisionRecipe())
    url_image = png_bomb()
    models = [{"name": "eyes", "path": str(path), "kind": "vision", "max_concurrency": 1, "max_queue": 1,
               "preload": True}]
    with serve(tree, models) as (url, process):
        _wait_loaded(url, "eyes")
        sampler = RssSampler(process)
        started = time.monotonic()
        results: list[tuple[int, float]] = []

        def one() -> None:
            body = {"model": "eyes", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url_image}}]}],
                "max_tokens": 4}
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            results.append((r.status_code, time.monotonic() - started))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = sampler.stop()
    refusals = sorted(s for code, s in results if code == 429)
    return {
        "png_bytes": len(url_image) * 3 // 4,
        "rss_before_mb": sampler.start_rss >> 20,
        "rss_peak_mb": peak >> 20,
        "statuses": sorted(code for code, _ in results),
        "first_429_s": round(refusals[0], 2) if refusals else None,
        "last_answer_s": round(max(s for _, s in results), 2),
    }


def long_prompt(tree: Path, chars: int = 5 << 20) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, build_model

    a, b = build_model(ModelRecipe("qwen2", "tiny", seed=0)), build_model(ModelRecipe("llama", "tiny", seed=1))
    models = [{"name": "a", "path": str(a), "preload": True}, {"name": "b", "path": str(b), "preload": True}]
    with serve(tree, models) as (url, process):
        _wait_loaded(url, "a")
        _wait_loaded(url, "b")
        gaps: list[float] = []
        streaming = threading.Event()
        done = threading.Event()

        def stream_b() -> None:
            body = {"model": "b", "messages": CHAT, "max_tokens": 4000, "ignore_eos": True, "stream": True}
            last = None
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    now = time.monotonic()
                    if line.startswith("data: ") and '"content"' in line:
                        if last is not None and streaming.is_set():
                            gaps.append(now - last)
                        last = now
                        streaming.set()
                    if done.is_set():
                        break

        streamer = threading.Thread(target=stream_b)
        streamer.start()
        streaming.wait(60)
        time.sleep(0.5)
        sampler = RssSampler(process)
        prompt = ("word " * (chars // 5 + 1))[:chars]
        started = time.monotonic()
        r = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                       json={"model": "a", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2})
        answer_s = time.monotonic() - started
        time.sleep(1.0)
        done.set()
        streamer.join(60)
        peak = sampler.stop()
    return {
        "prompt_chars": chars,
        "status": r.status_code,
        "answer_s": round(answer_s, 2),
        "other_stream_max_gap_s": round(max(gaps), 3) if gaps else None,
        "rss_growth_mb": (peak - sampler.start_rss) >> 20,
    }


def big_tools(tree: Path, properties: int = 20_000) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, build_model

    sys.path.insert(0, str(ROOT / "tests"))
    from tools.tool_models import with_template  # the tiny model with a template that renders tools

    a = with_template(build_model(ModelRecipe("qwen2", "tiny", seed=0)), Path(tempfile.mkdtemp()) / "hermes")
    schema = {"type": "object", "properties": {
        f"field_{i:05d}": {"type": "string", "description": f"The {i}th field of the record, in full, with every detail a careful clerk would want to write down about it." * 2}
        for i in range(properties)}}
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    anthropic_tools = [{"name": "record", "input_schema": schema}]
    bodies = {
        "chat": ("/v1/chat/completions", {"model": "a", "messages": user, "max_tokens": 4,
                                          "tools": [{"type": "function", "function": {"name": "record", "parameters": schema}}]}),
        "messages": ("/v1/messages", {"model": "a", "messages": user, "max_tokens": 4, "tools": anthropic_tools}),
        "count_tokens": ("/v1/messages/count_tokens", {"model": "a", "messages": user, "tools": anthropic_tools}),
        "responses": ("/v1/responses", {"model": "a", "input": "What is the weather?", "max_output_tokens": 16,
                                        "tools": [{"type": "function", "name": "record", "parameters": schema}]}),
    }
    out: dict[str, Any] = {"tool_bytes": len(json.dumps(anthropic_tools))}
    with serve(tree, [{"name": "a", "path": str(a), "tool_parser": "json_tools"}]) as (url, process):
        for name, (path, body) in bodies.items():
            payload = json.dumps(body).encode()
            sampler = RssSampler(process)
            started = time.monotonic()
            r = httpx.post(f"{url}{path}", content=payload, headers={"content-type": "application/json"}, timeout=300)
            seconds = time.monotonic() - started
            peak = sampler.stop()
            out[name] = {"status": r.status_code, "seconds": round(seconds, 3),
                         "rss_growth_mb": (peak - sampler.start_rss) >> 20}
    return out


def slow_clients(tree: Path) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, build_model

    a = build_model(ModelRecipe("qwen2", "tiny", seed=0))
    # The "after" tree bounds bodies at 30 s by default; 40 s covers it.
    with serve(tree, [{"name": "a", "path": str(a)}]) as (url, process):
        port = int(url.rsplit(":", 1)[1])
        fds_before = process.num_fds()
        socks = []
        for _ in range(300):
            with contextlib.suppress(OSError):
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"model\":")
                socks.append(s)
        time.sleep(1.0)
        fds_loaded = process.num_fds()
        time.sleep(40)
        fds_later = process.num_fds()
        healthy = httpx.get(f"{url}/health", timeout=10).status_code
        for s in socks:
            s.close()
    return {"fds_before": fds_before, "fds_with_300_slow": fds_loaded, "fds_after_40s": fds_later,
            "health_after": healthy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose mlxd to run")
    parser.add_argument("--label", default="after")
    scenarios = {
        "images": images,
        "long_prompt": long_prompt,
        "near_bound_prompt": lambda tree: long_prompt(tree, 120_000),
        "big_tools": big_tools,
        "slow_clients": slow_clients,
    }
    parser.add_argument("--only", choices=list(scenarios), action="append")
    args = parser.parse_args()
    result: dict[str, Any] = {"environment": environment(), "tree": str(args.tree)}
    for name in args.only or list(scenarios):
        result[name] = scenarios[name](args.tree.resolve())
        print(f"{args.label} {name}:", json.dumps(result[name]), flush=True)
    path = RESULTS_DIR / "request_bounds.json"
    previous = json.loads(path.read_text()).get(args.label, {}) if path.exists() else {}
    path = save("request_bounds", args.label, {**previous, **result})
    rows = [[f"{name}.{k}", v] for name in scenarios if name in result for k, v in result[name].items()]
    print(table(["figure", args.label], rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
