"""A long soak of one `mlxd serve`: steady chat traffic on three tiny models
(streamed and whole, shared system prompts so the prefix caches fill and
persist), clients that disconnect mid-stream, hot reloads (live changes and
drain-then-reload ones), admin unloads (each a save and a cache-dir bound),
and one SIGKILL with a restart on the same state and cache dirs.

    python -m bench.soak                 # 21 minutes
    python -m bench.soak --minutes 3     # a short look

What it reports (bench/results/soak.json): requests by status (any 5xx is a
failure), greedy answers to one prompt over the whole run (all identical?),
the server's RSS, and every model's persisted prefix cache: manifest entry
counts after the warm-up and at the end, the fewest seen in between (a cache
the bound deleted shows as 0), and whether every entry's bytes still match
its manifest's SHA-256.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench.common import environment, free_port, save, stop, table

SYSTEM = ("You are a careful assistant for a Python code base. Answer questions about argparse, pathlib, json "
          "and logging; quote code exactly and say which file you would read next. ")
QUESTIONS = ["Which function parses the command line?", "How are the logging handlers configured?",
             "List the files that define the HTTP routes", "Where is the configuration read?"]
GREEDY = [{"role": "user", "content": "Read the configuration file and report the errors"}]
NAMES = ("a", "b", "c")


class Soak:
    def __init__(self, tmp: Path, minutes: float, seed: int) -> None:
        from mlxd.factory import ModelRecipe, build_model

        self.tmp, self.deadline = tmp, time.monotonic() + minutes * 60
        self.paths = {"a": build_model(ModelRecipe("qwen2", "tiny", seed=0)),
                      "b": build_model(ModelRecipe("llama", "tiny", seed=1)),
                      "c": build_model(ModelRecipe("qwen2", "tiny", seed=2))}
        self.registry, self.port = tmp / "models.yaml", free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rng = random.Random(seed)
        self.generation = 0
        self.statuses: collections.Counter[str] = collections.Counter()
        self.greedy: list[str] = []
        self.rss: list[list[int]] = []
        self.events: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self.down = threading.Event()  # set while the daemon is killed and restarting
        self.lock = threading.Lock()
        self.write_registry()

    # ------------------------------------------------------------ the daemon
    def write_registry(self) -> None:
        self.generation += 1
        g = self.generation
        models = [
            {"name": "a", "path": str(self.paths["a"]), "max_concurrency": 2,
             "description": f"generation {g}"},  # applies live
            # Every third reload changes b's context: drained, unloaded (saved), loaded again.
            {"name": "b", "path": str(self.paths["b"]), "max_context": 2048 if (g // 3) % 2 else 1024},
            {"name": "c", "path": str(self.paths["c"]), "idle_unload_seconds": 20},
        ]
        doc = {"manager": {"memory_budget": "2GB", "cache_dir": str(self.tmp / "cache"),
                           "prefix_cache": {"disk_max_bytes": "3MB"}},
               "models": models}
        self.registry.write_text(yaml.safe_dump(doc, sort_keys=False))

    def start(self) -> None:
        env = {**os.environ, "MLXD_STATE_DIR": str(self.tmp / "state")}
        log = open(self.tmp / "daemon.log", "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlxd", "serve", "--config", str(self.registry), "--port", str(self.port),
             "--no-watch"], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError((self.tmp / "daemon.log").read_text()[-4000:])
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start")
            time.sleep(0.1)
        self.rss.append([])

    def kill_and_restart(self) -> None:
        assert self.process is not None
        self.down.set()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.events.append(f"{self.elapsed()}s SIGKILL")
        self.start()
        self.down.clear()
        self.events.append(f"{self.elapsed()}s restarted")

    def elapsed(self) -> int:
        return int(time.monotonic() - self.started)

    # ------------------------------------------------------------ traffic
    def count(self, what: str) -> None:
        with self.lock:
            self.statuses[what] += 1

    def client(self, index: int) -> None:
        rng = random.Random(index)
        while time.monotonic() < self.deadline:
            model = rng.choice(NAMES)
            session = rng.randrange(4)
            messages = [{"role": "system", "content": f"Session {session}. " + SYSTEM * 3},
                        {"role": "user", "content": rng.choice(QUESTIONS)}]
            body = {"model": model, "messages": messages, "max_tokens": rng.choice([8, 16, 32])}
            try:
                if rng.random() < 0.5:
                    self.stream(body, disconnect=rng.random() < 0.2)
                else:
                    reply = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120)
                    self.count(str(reply.status_code))
            except httpx.HTTPError:
                self.count("connection lost while killed" if self.down.is_set() else "connection error")
                time.sleep(0.5)

    def stream(self, body: dict[str, Any], disconnect: bool) -> None:
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json={**body, "stream": True},
                          timeout=120) as reply:
            if reply.status_code != 200:
                reply.read()
                self.count(str(reply.status_code))
                return
            for line in reply.iter_lines():
                if disconnect and '"content"' in line:
                    self.count("200 (client disconnected mid-stream)")
                    return
            self.count("200")

    # ------------------------------------------------------------ the operator
    def operator(self) -> None:
        kill_at = self.started + (self.deadline - self.started) / 2
        killed = False
        next_reload, next_unload, next_greedy, next_look = (time.monotonic() + s for s in (40, 60, 5, 10))
        while time.monotonic() < self.deadline:
            now = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                if not killed and now >= kill_at:
                    killed = True
                    self.kill_and_restart()
                if now >= next_reload:
                    self.write_registry()
                    report = httpx.post(f"{self.url}/v1/admin/reload", json={}, timeout=120).json()
                    self.events.append(f"{self.elapsed()}s reload {report.get('outcome')}: {report.get('summary')}")
                    next_reload = now + 40
                if now >= next_unload:
                    name = self.rng.choice(NAMES)
                    code = httpx.post(f"{self.url}/v1/models/{name}/unload", json={}, timeout=120).status_code
                    self.events.append(f"{self.elapsed()}s unload {name}: {code}")
                    next_unload = now + 60
                if now >= next_greedy:
                    body = {"model": "a", "messages": GREEDY, "max_tokens": 16, "temperature": 0}
                    reply = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120)
                    if reply.status_code == 200:
                        self.greedy.append(reply.json()["choices"][0]["message"]["content"])
                    next_greedy = now + 30
                if now >= next_look:
                    self.look()
                    next_look = now + 10
            time.sleep(0.2)

    def look(self) -> None:
        with contextlib.suppress(psutil.Error):
            if self.process is not None:
                self.rss[-1].append(psutil.Process(self.process.pid).memory_info().rss >> 20)
        for name, count in self.disk().items():
            with self.lock:
                self.lowest[name] = min(self.lowest.get(name, count), count)

    # ------------------------------------------------------------ the caches
    def folders(self) -> dict[str, Path]:
        from mlxd.engine.fingerprint import model_fingerprint

        return {name: self.tmp / "cache" / "prefix" / model_fingerprint(path, None)
                for name, path in self.paths.items()}

    def disk(self) -> dict[str, int]:
        counts = {}
        for name, folder in self.folders().items():
            try:
                counts[name] = len(json.loads((folder / "manifest.json").read_text())["entries"])
            except (OSError, ValueError, KeyError):
                counts[name] = 0
        return counts

    def intact(self) -> dict[str, bool]:
        out = {}
        for name, folder in self.folders().items():
            try:
                entries = json.loads((folder / "manifest.json").read_text())["entries"]
                out[name] = bool(entries) and all(
                    hashlib.sha256((folder / e["file"]).read_bytes()).hexdigest() == e["sha256"] for e in entries)
            except (OSError, ValueError, KeyError):
                out[name] = False
        return out

    def unload_all(self) -> None:
        for name in NAMES:
            httpx.post(f"{self.url}/v1/models/{name}/unload", json={}, timeout=120)

    # ------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        self.started = time.monotonic()
        self.start()
        # Warm-up: every model answers every session once, then unloads (saves).
        for name in NAMES:
            for session in range(4):
                messages = [{"role": "system", "content": f"Session {session}. " + SYSTEM * 3},
                            {"role": "user", "content": QUESTIONS[session]}]
                httpx.post(f"{self.url}/v1/chat/completions", timeout=120,
                           json={"model": name, "messages": messages, "max_tokens": 8})
        self.unload_all()
        before = self.disk()
        self.lowest: dict[str, int] = dict(before)
        clients = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(3)]
        for t in clients:
            t.start()
        self.operator()
        for t in clients:
            t.join(180)
        self.unload_all()
        assert self.process is not None
        stop(self.process, signal.SIGTERM, 120)
        after, intact = self.disk(), self.intact()
        server_errors = sum(n for s, n in self.statuses.items() if s.startswith("5"))
        return {
            "minutes": round((time.monotonic() - self.started) / 60, 1),
            "requests": dict(self.statuses),
            "server_errors": server_errors,
            "reloads": sum(1 for e in self.events if " reload " in e),
            "unloads": sum(1 for e in self.events if " unload " in e),
            "greedy_answers": len(self.greedy),
            "greedy_identical": len(set(self.greedy)) <= 1,
            "rss_mb": [{"first": r[0], "last": r[-1], "max": max(r)} for r in self.rss if r],
            "cache_entries_before": before,
            "cache_entries_after": after,
            "cache_entries_fewest_during": self.lowest,
            "cache_intact": intact,
            "events": self.events,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=21.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxd-soak-") as tmp:
        result = {"environment": environment(), **Soak(Path(tmp), args.minutes, args.seed).run()}
    result["load_average_end"] = os.getloadavg()[0]
    path = save("soak", args.label, result)
    rows = [[k, json.dumps(v)] for k, v in result.items() if k not in ("environment", "events")]
    print(table(["figure", args.label], rows))
    print("\n".join(result["events"]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
