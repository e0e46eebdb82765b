"""The event loop's CPU per streamed token, without a model or a socket.

    python bench/stream_cost.py
    python bench/stream_cost.py --tokens 5000 --step-ms 0.3

The daemon's own app (build_daemon) serves a stream from an engine whose
generator runs on the real MLX worker thread and sleeps like a decode step
(``--step-ms``, default 0.8 ms: the tiny model's pace here), so every token
takes the real path: the worker's hand-off, the engine wrapper, the stream's
inbox, the framer, Starlette and a no-op ASGI send. What is measured is the
CPU time of the event-loop thread per token, which a noisy shared machine
disturbs far less than a wall-clock rate; on a 2-core machine that time is
taken from the model's compute. bench/servers.py has the end-to-end rates.

Prints a table and merges the figures into bench/results/stream_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import environment, save, table  # noqa: E402


def paced_engine(tokens: int, step_s: float) -> Any:
    from mlxd.engine.lifecycle import EngineBase
    from mlxd.engine.types import GenerationChunk

    class PacedEngine(EngineBase):
        kind = "text"

        def _run(self, request: Any, control: Any) -> Any:
            for i in range(tokens):
                time.sleep(step_s)  # lets go of the GIL, as MLX's compute does
                control.completion_tokens = i + 1
                yield GenerationChunk(" tok", None, 5, i + 1)
            yield GenerationChunk("", "length", 5, tokens)

        def _release(self) -> dict[str, Any]:
            return {}

        def _forget(self) -> None:
            return None

    return PacedEngine


async def stream_once(app: Any, path: str, body: dict[str, Any]) -> int:
    """One streamed request over ASGI; returns how many body writes it took."""
    finished = asyncio.Event()
    writes = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal writes
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise SystemExit(f"{path} answered {message['status']}")
        if message["type"] == "http.response.body":
            writes += 1
            if not message.get("more_body", False):
                finished.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
             "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    return writes


class Lifespan:
    """The app's startup and shutdown, as a server runs them."""

    def __init__(self, app: Any) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task = asyncio.ensure_future(
            app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, self.inbox.get, self.outbox.put))

    async def signal(self, event: str) -> None:
        await self.inbox.put({"type": f"lifespan.{event}"})
        await asyncio.wait_for(self.outbox.get(), 30)


async def bench(tokens: int, step_s: float, repeats: int) -> dict[str, Any]:
    from mlxd.daemon.build import build_daemon
    from mlxd.engine.worker import MlxWorker
    from mlxd.registry.model import ManagerSpec, ModelSpec, Registry, ServerSpec
    from mlxd.settings import DaemonSettings

    engine_class = paced_engine(tokens, step_s)
    worker = MlxWorker()
    with tempfile.TemporaryDirectory(prefix="mlxd-stream-cost-") as tmp:
        spec = ModelSpec(name="m", path=Path(tmp) / "m", source="m", memory_override_bytes=1 << 20)
        registry = Registry(source_path=None, file_hash="x",
                            manager=ManagerSpec(memory_budget_bytes=1 << 30, cache_dir=Path(tmp) / "cache"),
                            server=ServerSpec(request_timeout_s=600), models=(spec,))

        async def engines(model_spec: Any, registry: Any) -> Any:
            return engine_class(model_spec, worker, load_bytes=0, load_seconds=0.0)

        daemon = build_daemon(DaemonSettings(state_dir=Path(tmp) / "state", watch_config=False), registry,
                              worker=worker, engines=engines)
        kinds = {
            "completions": ("/v1/completions", {"prompt": "x"}),
            "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
            "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}),
            "responses": ("/v1/responses", {"input": "x", "max_output_tokens": tokens + 1}),
        }
        costs: dict[str, list[float]] = {k: [] for k in kinds}
        writes: dict[str, int] = {}
        life = Lifespan(daemon.app)
        await life.signal("startup")
        try:
            for _ in range(repeats + 1):  # the first round warms up
                for kind, (path, extra) in kinds.items():
                    body = {"model": "m", "max_tokens": tokens + 1, "stream": True, "temperature": 0, **extra}
                    if kind == "responses":
                        del body["max_tokens"]
                    started = time.thread_time()
                    writes[kind] = await stream_once(daemon.app, path, body)
                    costs[kind].append((time.thread_time() - started) / tokens * 1e6)
        finally:
            await life.signal("shutdown")
            await life.task
    result: dict[str, Any] = {"tokens": tokens, "step_ms": step_s * 1000, "repeats": repeats}
    for kind, values in costs.items():
        values = sorted(values[1:])
        result[kind] = {"loop_cpu_us_per_token": round(statistics.median(values), 1),
                        "min": round(values[0], 1), "max": round(values[-1], 1), "writes": writes[kind]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--step-ms", type=float, default=0.8, help="the paced engine's time per token")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import uvloop

    uvloop.install()  # as uvicorn runs the daemon
    result = asyncio.run(bench(args.tokens, args.step_ms / 1000, args.repeats))
    result.update(environment())
    print(f"\nevent-loop CPU per streamed token: {args.tokens} tokens at {args.step_ms} ms each, "
          f"median of {args.repeats}, load average {result['load_average']:.1f}")
    print(table(["stream", "loop CPU us/token", "min-max", "body writes"],
                [[k, result[k]["loop_cpu_us_per_token"], f"{result[k]['min']}-{result[k]['max']}", result[k]["writes"]]
                 for k in ("completions", "chat", "messages", "responses")]))
    print(f"wrote {save('stream_cost', 'paced', result)}")


if __name__ == "__main__":
    main()
