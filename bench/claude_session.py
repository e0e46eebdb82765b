"""A recorded Claude Code session against mlxd (#28): three turns of a real
`claude -p` session (the pinned CLI under .agents/), the third one with a
changed system prompt, deliberately breaking the prefix. Capture is on, so
each turn can be followed from its X-Request-Id to its activity row and its
capture: the cached tokens of turn 2, and why turn 3 re-prefilled.

The daemon serves the demo registry as `mlxd demo` writes it (tiny size),
with an API key; the session asks for the demo's `qwen-tiny` with Claude
Code's system prompt replaced and two tools kept, as tests/agents does
(its full prompt is ~48k tokens on the tiny tokenizer).

    python bench/claude_session.py

Prints each request Claude Code sent (request id, activity row, capture)
and writes bench/recorded/claude_session.json: the rows, the captures'
cache decisions (without the prompt texts) and the CLI's replies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.common import ROOT, serving, table  # noqa: E402

KEY = "sk-recorded-session"
MODEL = "qwen-tiny"
TOOLS = "Bash,Read"
SYSTEM = "You are a terse assistant."
# Turn 3's: a changed first line, as a volatile header (a date) would be.
CHANGED = "Today is 2026-12-02. You are a terse assistant."
TURNS = [
    (SYSTEM, "List the files in this folder."),
    (SYSTEM, "Which of them is the largest?"),
    (CHANGED, "And the smallest?"),
]
OUT = ROOT / "bench" / "recorded" / "claude_session.json"


def claude_cli() -> str:
    found = shutil.which("claude") or shutil.which("claude", path=str(ROOT / ".agents" / "node_modules" / ".bin"))
    if not found:
        raise SystemExit("claude is not installed: run scripts/setup.sh --tests")
    return found


def turn(claude: str, url: str, home: Path, session: str, first: bool, system: str, prompt: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(HOME=str(home), ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=KEY, DISABLE_TELEMETRY="1",
               DISABLE_AUTOUPDATER="1", CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY="1")
    which = ["--session-id", session] if first else ["--resume", session]
    started = time.perf_counter()
    run = subprocess.run(
        [claude, "-p", prompt, "--model", MODEL, *which, "--system-prompt", system, "--tools", TOOLS],
        env=env, cwd=home, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    return {"prompt": prompt, "system": system, "exit": run.returncode,
            "seconds": round(time.perf_counter() - started, 2),
            "reply": run.stdout.strip()[-400:], "stderr": run.stderr.strip()[-400:]}


def main() -> None:
    from mlxd.cli.demo import write_demo

    claude = claude_cli()
    with tempfile.TemporaryDirectory(prefix="mlxd-claude-") as tmp:
        tmp_path = Path(tmp)
        registry = write_demo(tmp_path / "demo", sizes=("tiny",))
        # A cache of its own: the shared one may hold earlier sessions' turns.
        doc = yaml.safe_load(registry.read_text())
        doc.setdefault("manager", {})["cache_dir"] = str(tmp_path / "cache")
        registry.write_text(yaml.safe_dump(doc, sort_keys=False))
        home = tmp_path / "home"
        home.mkdir()
        for name, size in (("notes.txt", 10), ("data.csv", 2000), ("readme.md", 300)):
            (home / name).write_text("x" * size)
        auth = {"Authorization": f"Bearer {KEY}"}
        with serving(registry, tmp_path, env={"MLXD_API_KEYS": KEY}) as url:
            with httpx.Client(base_url=url, headers=auth, timeout=60) as http:
                http.put("/v1/capture", json={"enabled": True}).raise_for_status()
                session = str(uuid.uuid4())
                turns = [turn(claude, url, home, session, i == 0, system, prompt)
                         for i, (system, prompt) in enumerate(TURNS)]
                time.sleep(1.0)  # the last rows are committed
                found = http.get("/v1/activity", params={"surface": "messages", "limit": 100}).json()["data"]
                rows = list(reversed(found))
                captures = {c["request_id"]: c for c in http.get("/v1/captures").json()["data"]}
                details = {rid: http.get(f"/v1/captures/{rid}").json() for rid in captures}
    requests = []
    for row in rows:
        capture = details.get(row["request_id"]) or {}
        cache = dict(capture.get("cache") or {})
        for text in ("prompt_text", "entry_text"):  # the decision, not the prompts
            if isinstance(cache.get(text), str):
                cache[text] = cache[text][:160]
        requests.append({"request_id": row["request_id"], "model": row["model"], "status": row["status"],
                         "stream": row["stream"],
                         "tokens_in": row["tokens_in"], "tokens_cached": row["tokens_cached"],
                         "tokens_out": row["tokens_out"], "ttft_seconds": row["ttft_seconds"],
                         "duration_seconds": row["duration_seconds"], "finish_reason": row["finish_reason"],
                         "cache": cache})
    print(table(["#", "request id", "model", "status", "in", "cached", "out", "TTFT s", "cache decision"],
                [[i + 1, r["request_id"], r["model"], r["status"], r["tokens_in"], r["tokens_cached"], r["tokens_out"],
                  r["ttft_seconds"], _decision(r["cache"])] for i, r in enumerate(requests)]))
    for i, t in enumerate(turns, 1):
        print(f"turn {i}: exit {t['exit']} in {t['seconds']} s: {t['reply'][:100]!r}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([claude, "--version"], capture_output=True, text=True).stdout.strip()
    OUT.write_text(json.dumps({"cli": version, "model": MODEL, "turns": turns, "requests": requests,
                               "load_average": os.getloadavg()}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


def _decision(cache: dict[str, Any]) -> str:
    reason = cache.get("reason")
    if reason is None:
        return "-"
    if reason == "diverged":
        return f"diverged at token {cache.get('diverged_at')} of {cache.get('prompt_tokens')}"
    return f"{reason} ({cache.get('hit_tokens')} of {cache.get('prompt_tokens')} hit)"


if __name__ == "__main__":
    main()
