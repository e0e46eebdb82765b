"""Per-token overhead side by side: direct `mlx_lm.stream_generate`, mlxd,
`mlx_lm.server` and vllm-mlx on the same model, prompt and token count.

    python bench/servers.py                       # tiny, small and bench size (~8 min)
    python bench/servers.py --sizes tiny          # a quick run
    python bench/servers.py --sizes tiny --paths raw mlxd --repeats 20

Method, chosen to survive a noisy shared machine:
- every server is started once per size (all on OpenBLAS: this script
  re-executes itself with it in LD_PRELOAD and every child inherits that same
  variable; the table shows what each process mapped), and the direct path
  runs in a process of its own that keeps the model loaded;
- one warm-up request each, then rounds: raw, mlxd, mlx_lm.server, vllm-mlx,
  then mlxd, mlx_lm.server, vllm-mlx, raw, ... (each round starts one path
  later), so drift and the order within a round hit every path alike;
- the same request everywhere (/v1/completions, greedy, streamed), the same
  client for every server: a raw socket that only timestamps what it
  receives; the frames are parsed after the stream has ended, so the client
  costs the two shared cores next to nothing while a server decodes;
- decode tok/s excludes the first token: (tokens - 1) / (last token's
  arrival - first token's arrival);
- medians over the rounds, the spread (min-max and the quartiles), and each
  server's ratio to the direct run of the same round.

vllm-mlx is not one of mlxd's dependencies (it pins an older mlx-lm and pulls
in gradio, torch and more): `bash bench/setup_vllm_mlx.sh` installs it in a
venv of its own that reuses this environment's mlx and mlx-lm, so all four
paths run the same MLX. Without it the column is left out.

Prints a table and merges the figures into bench/results/servers.json.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench.common import PROMPT, daemon, environment, free_port, reexec_with_openblas, save, stop, table  # noqa: E402

PATHS = ("raw", "mlxd", "mlx_lm.server", "vllm-mlx")
LABELS = {"raw": "mlx_lm.stream_generate", "mlxd": "mlxd serve", "mlx_lm.server": "mlx_lm.server",
          "vllm-mlx": "vllm-mlx serve"}
# Enough tokens that a run lasts about half a second or more at each size.
TOKENS = {"tiny": 512, "small": 256, "bench": 32}
VLLM_MLX = Path.home() / ".cache" / "mlxd-bench" / "vllm-mlx" / "bin" / "vllm-mlx"


@dataclass
class Run:
    tokens: int
    decode_tok_s: float
    first_token_s: float
    text: str
    cpu_s: float = float("nan")


# --- the direct path, in a process of its own ---------------------------------


def raw_worker(model_path: str) -> None:
    """Reads a token count per line on stdin, answers one JSON line per run."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(model_path)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        tokens, prompt = ask["tokens"], ask["prompt"]
        times: list[float] = []
        texts: list[str] = []
        started = time.perf_counter()
        for response in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=tokens):
            times.append(time.perf_counter())
            texts.append(response.text)
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        print(json.dumps({"tokens": len(times), "decode_tok_s": rate, "first_token_s": times[0] - started,
                          "text": "".join(texts)}), flush=True)


class RawPath:
    def __init__(self, model_path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--raw-worker", str(model_path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        if not ready:
            raise RuntimeError("the direct path's process exited before loading the model")
        self.pid = self.process.pid

    def run(self, tokens: int, prompt: str = PROMPT) -> Run:
        assert self.process.stdin is not None and self.process.stdout is not None
        cpu = cpu_seconds(self.pid)
        self.process.stdin.write(json.dumps({"tokens": tokens, "prompt": prompt}) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        return Run(answer["tokens"], answer["decode_tok_s"], answer["first_token_s"], answer["text"],
                   cpu_seconds(self.pid) - cpu)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


# --- the servers ----------------------------------------------------------------


@dataclass
class ServerPath:
    port: int
    pid: int
    # What the request's "model" field must say on this server.
    model: str
    extra: dict[str, Any] = field(default_factory=dict)

    def run(self, tokens: int, prompt: str = PROMPT) -> Run:
        body = json.dumps({"model": self.model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()
        cpu = cpu_seconds(self.pid)
        started, times, chunks = stream(self.port, "/v1/completions", body)
        cpu = cpu_seconds(self.pid) - cpu
        run = parse_stream(started, times, chunks)
        run.cpu_s = cpu
        return run


def stream(port: int, path: str, body: bytes) -> tuple[float, list[float], list[bytes]]:
    """Send one request; return when it was sent and every received piece
    with its arrival time. Nothing is parsed while the server streams."""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    times: list[float] = []
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=600) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        recv, clock = sock.recv, time.perf_counter
        started = clock()
        sock.sendall(request)
        while data := recv(1 << 16):
            times.append(clock())
            chunks.append(data)
    return started, times, chunks


def parse_stream(started: float, times: list[float], chunks: list[bytes]) -> Run:
    """The SSE frames of a finished stream, each timed by the piece that
    completed it (chunked transfer encoding or a plain body)."""
    raw = b"".join(chunks)
    ends = []  # raw offset where each received piece ends
    total = 0
    for chunk in chunks:
        total += len(chunk)
        ends.append(total)
    head_end = raw.index(b"\r\n\r\n") + 4
    head = raw[:head_end].decode("latin-1")
    status = head.split(" ", 2)[1]
    if status != "200":
        raise RuntimeError(f"HTTP {status}: {raw[head_end:head_end + 500]!r}")
    # (body offset, raw offset) where each stretch of body bytes starts.
    segments: list[tuple[int, int]] = []
    body = bytearray()
    if "transfer-encoding: chunked" in head.lower():
        at = head_end
        while True:
            line_end = raw.index(b"\r\n", at)
            size = int(raw[at:line_end].split(b";")[0], 16)
            if size == 0:
                break
            segments.append((len(body), line_end + 2))
            body += raw[line_end + 2 : line_end + 2 + size]
            at = line_end + 2 + size + 2
    else:
        segments.append((0, head_end))
        body += raw[head_end:]
    starts = [s[0] for s in segments]

    def arrival(body_offset: int) -> float:
        segment = segments[bisect.bisect_right(starts, body_offset) - 1]
        return times[bisect.bisect_right(ends, segment[1] + body_offset - segment[0])]

    texts: list[str] = []
    content_times: list[float] = []
    usage_tokens = None
    at = 0
    text = bytes(body)
    while (end := text.find(b"\n\n", at)) != -1:
        frame, frame_end, at = text[at:end], end, end + 2
        for line in frame.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            payload = json.loads(line[6:])
            if payload.get("usage"):
                usage_tokens = payload["usage"].get("completion_tokens", usage_tokens)
            for choice in payload.get("choices") or []:
                delta = choice.get("delta") or {}
                # A thinking model's reasoning streams as reasoning deltas: output too.
                piece = (choice.get("text") or delta.get("content") or delta.get("reasoning_content")
                         or delta.get("reasoning") or "")
                if piece:
                    texts.append(piece)
                    content_times.append(arrival(frame_end - 1))
    tokens = usage_tokens if usage_tokens is not None else len(texts)
    if not content_times:
        raise RuntimeError("the stream carried no text")
    span = content_times[-1] - content_times[0]
    return Run(tokens, (tokens - 1) / span if span > 0 else float("nan"), content_times[0] - started, "".join(texts))


@contextlib.contextmanager
def process_server(name: str, argv: list[str], port: int, model: str, logs: Path) -> Iterator[ServerPath]:
    log = open(logs / f"{name}.log", "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(port, process, logs / f"{name}.log")
        yield ServerPath(port, process.pid, model)
    finally:
        stop(process, signal.SIGINT, 30)
        log.close()


def wait_ready(port: int, process: subprocess.Popen[bytes], log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{log.stem} exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if sock.recv(64).split(b"\r\n", 1)[0].endswith(b" 200 OK"):
                    return
        time.sleep(0.2)
    raise RuntimeError(f"{log.stem} did not start within {seconds:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children so far: unlike
    wall time it barely moves when other jobs share the cores."""
    import psutil

    try:
        process = psutil.Process(pid)
        total = sum(process.cpu_times()[:2])
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:2])
        return total
    except psutil.Error:
        return float("nan")


def blas_of(pid: int) -> str:
    """Which BLAS a process has mapped, read from /proc (any server alike)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "unknown"
    if "libopenblas" in maps:
        return "openblas"
    return "bundled" if "libblas" in maps else "none mapped"


# --- one size -------------------------------------------------------------------


def prompt_of(model_path: Path, tokens: int | None) -> str:
    """PROMPT repeated and cut to ``tokens`` tokens of the model's own
    tokenizer (time to first token grows with the prompt); PROMPT itself
    without a length."""
    if tokens is None:
        return PROMPT
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    ids = tokenizer.encode(PROMPT * (tokens // 8 + 1), add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def bench_size(size: str, tokens: int, repeats: int, paths: list[str], vllm_mlx: Path,
               prompt_tokens: int | None = None) -> dict[str, Any]:
    from mlxd.factory import ModelRecipe, build_model

    model_path = build_model(ModelRecipe("qwen2", size, dtype="float32"))
    prompt = prompt_of(model_path, prompt_tokens)
    with contextlib.ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mlxd-servers-")))
        started: dict[str, Any] = {}
        # Servers first (they start side by side), the direct path last.
        if "mlxd" in paths:
            entry = {"name": "m", "path": str(model_path), "preload": True, "max_context": 32768,
                     "idle_unload_seconds": 0, "prefix_cache": {"max_bytes": 0, "persist": False}}
            # Every path in a session of its own: autogroup scheduling shares
            # the CPU per session (bench/common.py, serving).
            url = stack.enter_context(daemon([entry], log_to=logs / "mlxd.log", session=True))
            port = int(url.rsplit(":", 1)[1])
            pid = httpx.get(f"{url}/v1/status", timeout=30).json()["daemon"]["pid"]
            started["mlxd"] = ServerPath(port, pid, "m")
        if "mlx_lm.server" in paths:
            port = free_port()
            started["mlx_lm.server"] = stack.enter_context(process_server(
                "mlx_lm.server", [sys.executable, "-m", "mlx_lm.server", "--model", str(model_path),
                                  "--port", str(port), "--log-level", "WARNING"], port, "default_model", logs))
        if "vllm-mlx" in paths:
            port = free_port()
            started["vllm-mlx"] = stack.enter_context(process_server(
                "vllm-mlx", [str(vllm_mlx), "serve", str(model_path), "--port", str(port),
                             "--served-model-name", "m", "--offline", "--disable-prefix-cache"],
                port, "m", logs))
        if "raw" in paths:
            raw = RawPath(model_path)
            stack.callback(raw.close)
            started["raw"] = raw
        order = [p for p in PATHS if p in started]
        blas = {p: blas_of(started[p].pid) for p in order}
        for p in order:  # warm-up: MLX compiles some CPU kernels on first use
            started[p].run(tokens, prompt)
        load = [os.getloadavg()[0]]
        runs: dict[str, list[Run]] = {p: [] for p in order}
        print(f"qwen2-{size}: {repeats} rounds of {', '.join(order)}", end="", flush=True)
        for round_ in range(repeats):
            # With a prompt length, each round's prompt opens differently, so
            # no server's prompt cache answers it from the last round.
            ask = f"# {round_}\n{prompt}" if prompt_tokens else prompt
            # Each round starts one path later, so none always goes first.
            for p in order[round_ % len(order):] + order[: round_ % len(order)]:
                runs[p].append(started[p].run(tokens, ask))
            load.append(os.getloadavg()[0])
            print(".", end="", flush=True)
        print()
    result = summarize(size, tokens, repeats, runs, blas, load)
    result["prompt_tokens"] = prompt_tokens
    return result


def spread(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(statistics.median(values), 3), "min": round(values[0], 3),
            "max": round(values[-1], 3), "iqr": [round(quartiles[0], 3), round(quartiles[2], 3)]}


def summarize(size: str, tokens: int, repeats: int, runs: dict[str, list[Run]], blas: dict[str, str],
              load: list[float]) -> dict[str, Any]:
    result: dict[str, Any] = {"size": size, "tokens": tokens, "repeats": repeats, "paths": {},
                              "load_average_during": {"min": min(load), "max": max(load)}}
    reference = runs.get("raw")
    for name, rs in runs.items():
        rates = [r.decode_tok_s for r in rs]
        entry: dict[str, Any] = {
            "decode_tok_s": spread(rates),
            "first_token_ms": round(statistics.median(r.first_token_s for r in rs) * 1000, 2),
            "tokens": sorted({r.tokens for r in rs}),
            "cpu_us_per_token": round(statistics.median(r.cpu_s / r.tokens for r in rs) * 1e6, 1),
            "blas": blas[name],
            "runs": [round(x, 1) for x in rates],
        }
        if reference is not None:
            entry["same_text_as_raw"] = all(r.text == d.text for r, d in zip(rs, reference))
            entry["ratio_of_medians"] = round(entry["decode_tok_s"]["median"]
                                              / result_median(reference), 3)
            # Each run against the direct run of its own round.
            entry["ratio_per_round"] = spread([r.decode_tok_s / d.decode_tok_s for r, d in zip(rs, reference)])
            # Time to first token added over the direct run of the same round.
            entry["first_token_added_ms"] = round(statistics.median(
                (r.first_token_s - d.first_token_s) * 1000 for r, d in zip(rs, reference)), 2)
        result["paths"][name] = entry
    return result


def result_median(runs: list[Run]) -> float:
    return statistics.median(r.decode_tok_s for r in runs)


def print_result(result: dict[str, Any]) -> None:
    paths = result["paths"]
    rows = []
    for name, entry in paths.items():
        d = entry["decode_tok_s"]
        ratio = entry.get("ratio_per_round")
        rows.append([
            LABELS[name], f"{d['median']:.1f}", f"{d['min']:.0f}-{d['max']:.0f}",
            f"{entry['ratio_of_medians']:.3f}" if "ratio_of_medians" in entry else "",
            f"{ratio['iqr'][0]:.3f}-{ratio['iqr'][1]:.3f}" if ratio else "",
            f"{ratio['min']:.3f}-{ratio['max']:.3f}" if ratio else "",
            entry["cpu_us_per_token"], entry["first_token_ms"],
            f"{entry['first_token_added_ms']:+.1f}" if "first_token_added_ms" in entry else "", entry["blas"],
            {True: "yes", False: "NO"}.get(entry.get("same_text_as_raw"), ""),
        ])
    load = result["load_average_during"]
    prompt = f", {result['prompt_tokens']}-token prompt" if result.get("prompt_tokens") else ""
    print(f"\nqwen2-{result['size']} (float32): {result['tokens']} tokens{prompt}, {result['repeats']} rounds, "
          f"load average {load['min']:.1f}-{load['max']:.1f}")
    print(table(["path", "decode tok/s", "min-max", "÷ raw", "per-round IQR", "per-round min-max",
                 "CPU us/token", "first token ms", "added ms", "BLAS", "same text"], rows))


def print_summary(results: list[dict[str, Any]]) -> None:
    """One line per size: the direct rate, then each server's share of it
    (ratio of the medians, and the quartiles of the per-round ratios)."""
    servers = [p for p in PATHS[1:] if any(p in r["paths"] for r in results)]
    rows = []
    for result in results:
        paths = result["paths"]
        raw = paths.get("raw")
        row = [f"qwen2-{result['size']}", f"{raw['decode_tok_s']['median']:.1f}" if raw else ""]
        for name in servers:
            entry = paths.get(name)
            if entry is None or raw is None:
                row.append("")
                continue
            iqr = entry["ratio_per_round"]["iqr"]
            row.append(f"{entry['ratio_of_medians']:.3f} ({iqr[0]:.2f}-{iqr[1]:.2f})")
        rows.append(row)
    print("\ndecode tok/s through each server ÷ direct (per-round quartiles)")
    print(table(["model", "direct tok/s", *(LABELS[s] for s in servers)], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=list(TOKENS), default=list(TOKENS))
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--repeats", type=int, default=10, help="rounds (each path once per round)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per request (default: by size)")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="a prompt of this many tokens (default: the short PROMPT)")
    parser.add_argument("--vllm-mlx", type=Path, default=VLLM_MLX, help="the vllm-mlx command")
    parser.add_argument("--raw-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_worker:
        raw_worker(args.raw_worker)
        return
    reexec_with_openblas()
    paths = list(args.paths)
    if "vllm-mlx" in paths and not args.vllm_mlx.exists():
        print(f"(no vllm-mlx at {args.vllm_mlx}: `bash bench/setup_vllm_mlx.sh` installs it; left out)")
        paths.remove("vllm-mlx")
    results = []
    for size in args.sizes:
        result = bench_size(size, args.tokens or TOKENS[size], args.repeats, paths, args.vllm_mlx,
                             args.prompt_tokens)
        result.update(environment())
        print_result(result)
        print(f"wrote {save('servers', f'qwen2-{size}', result)}", flush=True)
        results.append(result)
    if len(results) > 1:
        print_summary(results)


if __name__ == "__main__":
    main()
