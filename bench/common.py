"""Shared pieces of the benchmarks: OpenBLAS, result files, a daemon process."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"

# Real source text: a random model fed repeated words tends to stop at once.
PROMPT = (
    "import argparse\nimport json\nfrom pathlib import Path\n\n\n"
    "def parse_arguments(argv):\n"
    '    """Read the command line and return the options."""\n'
    "    parser = argparse.ArgumentParser(description="
)


def reexec_with_openblas() -> None:
    """Benchmarks on the bundled reference BLAS measure the wrong thing."""
    from mlxd.engine.blas import preload_env

    env = preload_env(os.environ)
    if env is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def add_dtype_option(parser: Any) -> None:
    parser.add_argument("--dtype", default="auto",
                        help="model dtype: auto (bfloat16 on GPUs and Metal, float32 on Linux CPU), "
                             "float32, float16, bfloat16")


def model_dtype(args: Any) -> str:
    """The dtype ``--dtype`` asks for, resolved for this machine's device."""
    from mlxd.dtypes import device_dtype

    return device_dtype(args.dtype)


def environment() -> dict[str, Any]:
    from mlxd.engine.blas import active_blas
    from mlxd.registry.device import current_device

    device = current_device()
    return {
        "blas": active_blas(),
        "device": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def save(name: str, key: str, result: dict[str, Any]) -> Path:
    """Merge ``result`` under ``key`` into bench/results/<name>.json."""
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    existing: dict[str, Any] = {}
    if path.exists():
        try:
            existing = json.loads(path.read_text())
        except json.JSONDecodeError:
            existing = {}
    existing[key] = result
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def stop(process: subprocess.Popen[bytes], sig: int, seconds: float) -> None:
    """Ask a server to stop with ``sig``; kill it if it has not within ``seconds``."""
    process.send_signal(sig)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def daemon(
    models: list[dict[str, Any]],
    manager: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    log_to: Path | None = None,
    backends: dict[str, Any] | None = None,
    cpus: set[int] | None = None,
    cwd: Path | None = None,
    session: bool = False,
) -> Iterator[str]:
    """A `mlxd serve` process (which preloads OpenBLAS itself) on a temporary
    registry. Yields its base URL. ``env`` adds variables; ``log_to`` keeps a
    copy of its log; ``cpus`` pins it (every thread it will have) to those
    cores; ``cwd`` is where it runs (``-m mlxd`` imports mlxd from there first);
    ``session`` starts it in a session of its own (see ``serving``)."""
    with tempfile.TemporaryDirectory(prefix="mlxd-bench-") as tmp:
        registry = Path(tmp) / "models.yaml"
        doc = {
            "manager": {"memory_budget": "70%", "cache_dir": str(Path(tmp) / "cache"), **(manager or {})},
            **({"backends": backends} if backends else {}),
            "models": models,
        }
        registry.write_text(yaml.safe_dump(doc, sort_keys=False))
        with serving(registry, Path(tmp), env=env, log_to=log_to, cpus=cpus, cwd=cwd, session=session) as url:
            yield url


@contextlib.contextmanager
def serving(registry: Path, tmp: Path, env: dict[str, str] | None = None,
            log_to: Path | None = None, cpus: set[int] | None = None, cwd: Path | None = None,
            session: bool = False) -> Iterator[str]:
    """`mlxd serve --config registry`, its state and log in ``tmp``, until
    the block ends. Yields its base URL once /health answers. ``session``:
    in a session of its own. With the kernel's autogroup scheduling each
    session shares the CPU as one, so on a loaded machine processes in the
    bench's session and in others are not timed alike (measured: mlxd +49 ms
    to first token over a direct path in the same session, -4 to +12 ms with
    each in its own)."""
    port = free_port()
    env = {**os.environ, "MLXD_STATE_DIR": str(tmp / "state"), **(env or {})}
    log_path = tmp / "daemon.log"
    log = open(log_path, "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxd", "serve", "--config", str(registry), "--port", str(port), "--no-watch"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=session,
        # Set before exec, so the BLAS and MLX threads it starts inherit it.
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # A fresh GPU machine compiles its kernels in the first load's warm-up:
        # a speech model's took over 120 s on an H100 (2026-12-07).
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"daemon exited: {log_path.read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])
                raise RuntimeError(f"daemon did not start in 300 s; its log ends:\n{tail}")
            time.sleep(0.1)
        yield url
    finally:
        stop(process, signal.SIGTERM, 120)
        log.close()
        if log_to is not None:
            log_to.parent.mkdir(parents=True, exist_ok=True)
            log_to.write_text(log_path.read_text())


@contextlib.contextmanager
def switch_interval_env(seconds: float | None) -> Iterator[dict[str, str]]:
    """Environment for a daemon whose GIL switch interval is ``seconds``
    (``sys.setswitchinterval`` through a sitecustomize on its PYTHONPATH);
    empty for Python's default (None)."""
    if seconds is None:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="mlxd-switch-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(f"import sys\nsys.setswitchinterval({seconds})\n")
        yield {"PYTHONPATH": os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH", "")) if p)}


def gather_reports(done: Any, processes: list[Any], what: str, timeout: float = 600) -> list[Any]:
    """One report from each client process on ``done`` (a string: the
    client's failure), the processes joined; raises naming ``what`` when one
    failed."""
    reports = [done.get(timeout=timeout) for _ in processes]
    for process in processes:
        process.join()
    failed = [r for r in reports if isinstance(r, str)]
    if failed:
        raise RuntimeError(f"{what} failed: {failed[0]}")
    return reports


def prefilled_row(model: Any, length: int, seed: int) -> tuple[list[Any], list[int]]:
    """A request as the daemon hands it to a batch: ``length`` synthetic
    tokens (``seed`` tells them apart), all but the last already in a cache
    of its own."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = [(seed * 7 + i) % 1000 + 10 for i in range(length)]
    cache = make_prompt_cache(model)
    model(mx.array(tokens[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache, tokens


def wait_warm(http: httpx.Client, names: tuple[str, ...], limit_s: float = 600) -> None:
    """Until each model's warm-up is done: on a machine whose kernel cache
    does not know the models it runs in the background, behind the first
    requests, and the bench would time its kernel compiles."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        models = {m["name"]: m for m in http.get("/v1/status").json()["models"]}
        if all(models.get(n, {}).get("warmup_done") is not False for n in names):
            return
        time.sleep(0.5)
    print(f"warm-up not done after {limit_s:.0f}s; timing anyway", flush=True)
