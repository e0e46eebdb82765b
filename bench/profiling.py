"""The benches' py-spy sampling of a running daemon: which threads work, in
which functions and, with native frames, under which libraries (MLX, cuDNN,
cuBLASLt...). ``sampled`` wraps a stretch of a bench; ``profile`` and
``summarize`` are its parts."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# py-spy pauses the daemon for each native sample: few enough that it barely shows.
NATIVE_RATE = 100


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def newest_daemon_pid(url: str | None = None) -> int:
    """The ``mlxd serve`` started last on this machine (the bench's own), or
    the one serving ``url``: a test run beside the bench starts daemons too,
    and a thread census of one that exited failed the bench."""
    pattern = "mlxd serve" + (f" .*--port {url.rsplit(':', 1)[1]}( |$)" if url else "")
    return int(subprocess.run(["pgrep", "-n", "-f", pattern], capture_output=True, text=True).stdout.split()[0])


def python_thread_names(pid: int) -> dict[str, str]:
    """Native thread id -> thread name. The daemon names the threads it
    starts for the kernel (mlxd/thread_names.py: 15 bytes of the Python
    name on Linux); py-spy's dump, where it is installed, gives the full
    names. The main thread is the event loop; threads nobody named (MLX's,
    BLAS's) are left out."""
    names: dict[str, str] = {}
    process = Path(f"/proc/{pid}/comm").read_text().strip()
    # A thread inherits its creator's name: the BLAS and MLX threads the
    # worker starts are "mlx-worker" too. The one named first (its id the
    # lowest) is the daemon's.
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda task: int(task.name)):
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        if comm != process and comm not in names.values():
            names[task.name] = comm
    names[str(pid)] = "MainThread"
    binary = py_spy()
    if binary is not None:
        dump = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                              text=True).stdout
        names.update(re.findall(r'^Thread (\d+) \(\w+\): "([^"]+)"', dump, re.M))
    return names


def thread_cpu(pid: int, names: dict[str, str]) -> dict[str, float]:
    """CPU seconds so far of each of the process's threads, by Python name
    where known (the rest, MLX's and BLAS's threads, as "other") (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = names.get(task.name, "other")
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] += (int(fields[11]) + int(fields[12])) / ticks
    return out


def profile(pid: int, seconds: float, out: Path, *, gil: bool = True, native: bool = False,
            rate: int = 500) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` for ``seconds`` into ``out`` (raw format).
    ``gil``: only the samples of the thread holding the GIL; ``native``: C
    and C++ frames too (what MLX, cuDNN or cuBLAS do under a Python call),
    which py-spy can only take with the process paused at each sample."""
    binary = py_spy()
    if binary is None:
        print("py-spy not found: no profile")
        return None
    gil = gil and not os.environ.get("BATCH_PROFILE_ALL")
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--threads", *(["--gil"] if gil else []),
                             *(["--native"] if native else ["--nonblocking"]), "--format", "raw",
                             "-r", str(rate), "-d", f"{seconds:.0f}", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def summarize(raw: Path, seconds: float, rate: int = 500, gil: bool = True, top: int = 14) -> str:
    """Per thread: its share of the samples (with ``gil``, py-spy kept only
    the GIL holder's: its share of the GIL) and its functions with the most
    samples, self and inclusive."""
    threads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    # Native frames name their library ("cudnnCreate (libcudnn.so.9)"): the
    # share of a thread's samples under each one says which does the work.
    libraries: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread")), "thread ?")
        body = [f for f in frames if not f.startswith(("process", "thread"))]
        n = int(count)
        totals[thread] += n
        if body:
            threads[thread][body[-1]] += n
            for f in set(body):
                inclusive[thread][f] += n
            for lib in {m.group(1) for f in body if (m := re.search(r"\((lib[^ )]*\.so[^ )]*)\)$", f))}:
                libraries[thread][lib] += n
    lines = []
    expected = seconds * rate
    for thread, n in totals.most_common():
        lines.append(f"{thread}: {'holds the GIL' if gil else 'active'} in {100 * n / expected:.0f}% of the samples")
        if libraries[thread]:
            lines.append("    under: " + ", ".join(f"{lib} {100 * m / n:.0f}%" for lib, m in libraries[thread].most_common(8)))
        for f, m in threads[thread].most_common(6):
            lines.append(f"    self {100 * m / n:5.1f}%  {f}")
        for f, m in inclusive[thread].most_common(top):
            lines.append(f"    incl {100 * m / n:5.1f}%  {f}")
    return "\n".join(lines)


@dataclass
class Sampling:
    # The summary, once the ``sampled`` block has ended.
    report: str = ""


@contextlib.contextmanager
def sampled(out: Path | None, *, native: bool = True, rate: int = NATIVE_RATE, top: int = 40) -> Iterator[Sampling]:
    """py-spy on the bench's daemon (every thread, native frames unless told
    otherwise) for as long as the block runs; the raw samples go to ``out``
    and their summary to the yielded ``Sampling.report``. ``out`` None:
    nothing is sampled (a bench run without ``--profile``)."""
    result = Sampling()
    if out is None:
        yield result
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = profile(newest_daemon_pid(), 24 * 3600, out, gil=False, native=native, rate=rate)
    started = time.monotonic()
    try:
        yield result
    finally:
        if spy is None:
            result.report = "py-spy not found: no profile"
        else:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
            spy.wait()
            result.report = (summarize(out, time.monotonic() - started, rate=rate, gil=False, top=top)
                             if out.exists() else "py-spy wrote nothing")
