"""What one read of a streamed answer costs the reader: CPU time per event
for httpx, aiohttp and a bare asyncio protocol (the floor: the wake-up and
the system call, no HTTP parsing), against a local server that sends one
chat-completion event every few milliseconds, the way a backend sends its
tokens.

    python bench/relay_read.py                 # 600 events x 3 rounds a client: about 25 s
    python bench/relay_read.py --events 2000 --gap-ms 2

This is why the relay to remote backends (mlxd/remote) reads with aiohttp:
a front pays one such read per relayed token. The server runs in its own
process, so the figures are the reader's alone (its process CPU time).
Prints a table and merges the figures into bench/results/relay_read.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import environment, free_port, save, table  # noqa: E402

EVENT = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n')
DONE = b"data: [DONE]\n\n"


def serve(port: int, events: int, gap_s: float) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def answer():  # type: ignore[no-untyped-def]
        for _ in range(events):
            yield EVENT
            await asyncio.sleep(gap_s)
        yield DONE

    async def endpoint(request):  # type: ignore[no-untyped-def]
        return StreamingResponse(answer(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop", http="httptools")


async def read_httpx(url: str) -> int:
    async with httpx.AsyncClient(timeout=None) as client:
        reads = 0
        async with client.stream("POST", url, json={}) as response:
            async for _ in response.aiter_bytes():
                reads += 1
        return reads


async def read_aiohttp(url: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        reads = 0
        async with session.post(url, json={}) as response:
            async for _ in response.content.iter_any():
                reads += 1
        return reads


async def read_protocol(url: str) -> int:
    """The floor: bytes handed to a protocol, nothing parsed but the end."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    reads = 0

    class Reader(asyncio.Protocol):
        def connection_made(self, transport):  # type: ignore[no-untyped-def]
            transport.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")

        def data_received(self, data: bytes) -> None:
            nonlocal reads
            reads += 1
            if DONE in data and not done.done():
                done.set_result(None)

    transport, _ = await loop.create_connection(Reader, host, int(port))
    await done
    transport.close()
    return reads


def measure(reader: Callable[[str], Awaitable[int]], url: str) -> float:
    """CPU microseconds per read, for one whole streamed answer."""
    import uvloop

    started = time.process_time()
    reads = uvloop.run(reader(url))
    return (time.process_time() - started) / reads * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=600, help="events per answer")
    parser.add_argument("--gap-ms", type=float, default=4.0, help="time between two events")
    parser.add_argument("--rounds", type=int, default=3, help="answers per client, interleaved")
    args = parser.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.events, args.gap_ms / 1000), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise SystemExit("the event server did not start") from None
            time.sleep(0.1)
    readers = {"bare asyncio protocol (floor)": read_protocol, "aiohttp": read_aiohttp, "httpx": read_httpx}
    runs: dict[str, list[float]] = {name: [] for name in readers}
    try:
        for _ in range(args.rounds):
            for name, reader in readers.items():
                runs[name].append(measure(reader, url))
    finally:
        server.terminate()
    medians = {name: statistics.median(values) for name, values in runs.items()}
    floor = medians["bare asyncio protocol (floor)"]
    result = {
        "events": args.events, "gap_ms": args.gap_ms, "rounds": args.rounds,
        "cpu_us_per_read": {name: round(value, 1) for name, value in medians.items()},
        "above_floor_us": {name: round(value - floor, 1) for name, value in medians.items()},
        "runs": {name: [round(v, 1) for v in values] for name, values in runs.items()},
        **environment(),
    }
    print(f"\n{args.events} events {args.gap_ms:g} ms apart, {args.rounds} answers a reader, "
          f"load average {result['load_average']:.1f}")
    print(table(["reader", "CPU us per read (median)", "above the floor"],
                [[name, f"{medians[name]:.1f}", f"{medians[name] - floor:.1f}"] for name in readers]))
    print(f"wrote {save('relay_read', 'loopback', result)}")


if __name__ == "__main__":
    main()
