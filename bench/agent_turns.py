"""Prefix-cache hit rate and time to first token over a 10-turn coding-agent
conversation on /v1/messages, turn by turn, with and without the
normalisation of Claude Code's per-request billing line.

The conversation has the shape Claude Code 2.1.197 sends (captured from a
real `claude -p` run): system blocks in its order (the
``x-anthropic-billing-header: cc_version=2.1.197.<fingerprint>; ...`` line,
the agent preamble, the long instructions with ``cache_control``), its
tool list shape, streaming, and turns that alternate tool_use and
tool_result. The text is mlxd's own docs and tool descriptions written for
this bench, not Claude Code's prompt. Claude Code derives the fingerprint
from the conversation's messages, so it differs between sessions, between
the main thread and its side queries and subagents, and when the first
message changes (compaction); this bench changes it on every turn, the case
the issue describes. Assistant turns are what the model really answers
(greedy), so the history is what the prefix cache holds.

    python bench/agent_turns.py             # tiny factory model
    python bench/agent_turns.py --size small

Per model family (every cache type) against mlx_lm.server and vllm-mlx in
one run: bench/agent_families.py.

"without" runs the same turns with the normalisation switched off in this
process (the daemon runs in a thread here so it can be). Prints a table and
writes bench/results/agent_turns.json. Timing only: nothing passes or fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.common import ROOT, environment, free_port, reexec_with_openblas, save, table  # noqa: E402

TURNS = 10
TOOLS = [
    ("Bash", "Run a shell command in the project and return its output.", {"command": "string", "timeout": "integer"}),
    ("Read", "Read a file from the project, optionally a range of lines.", {"file_path": "string", "offset": "integer"}),
    ("Edit", "Replace an exact string in a file with another.", {"file_path": "string", "old_string": "string", "new_string": "string"}),
    ("Write", "Write a whole file.", {"file_path": "string", "content": "string"}),
    ("Glob", "List files whose path matches a glob pattern.", {"pattern": "string"}),
    ("Grep", "Search file contents with a regular expression.", {"pattern": "string", "path": "string"}),
    ("TodoWrite", "Keep the task list for this session.", {"todos": "string"}),
    ("WebFetch", "Fetch a URL and answer a question about it.", {"url": "string", "prompt": "string"}),
]
USER_TURNS = [
    "Find where the request timeout is read from the settings.",
    "Now show me the module that turns engine chunks into output events.",
    "Which tests cover the streaming path?",
    "Run the tests of the api folder.",
    "Explain why the lease is released in two places.",
]
TOOL_RESULT = "mlxd/settings.py:51:    heartbeat_seconds: float = Field(default=5.0, gt=0)\nmlxd/api/plan.py:88: def _timeout(ctx, asked)"


def billing_line(turn: int) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.197.{(turn * 2654435761) % 4096:03x}; cc_entrypoint=cli;"


def system_blocks(turn: int) -> list[dict[str, Any]]:
    instructions = "\n\n".join((ROOT / "docs" / name).read_text() for name in ("architecture.md", "tools.md"))
    return [
        {"type": "text", "text": billing_line(turn)},
        {"type": "text", "text": "You are a coding agent working in the user's repository.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": instructions[:9000], "cache_control": {"type": "ephemeral"}},
    ]


def tool_list() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "description": text,
            "input_schema": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in params.items()},
                "required": [next(iter(params))],
            },
        }
        for name, text, params in TOOLS
    ]


def stream_turn(url: str, key: str, body: dict[str, Any]) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """(seconds to the first content event, the final usage, the assistant's content blocks)."""
    started = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    blocks: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{url}/v1/messages?beta=true", json=body, timeout=600,
                      headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            kind = event["type"]
            if kind == "content_block_start":
                first = first or time.perf_counter() - started
                blocks.append(dict(event["content_block"]))
            elif kind == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "text_delta":
                    blocks[-1]["text"] += delta["text"]
                else:
                    blocks[-1]["partial"] = blocks[-1].get("partial", "") + delta["partial_json"]
            elif kind == "message_delta":
                usage = event["usage"]
            elif kind == "error":
                raise RuntimeError(event["error"]["message"])
    for block in blocks:
        if block["type"] == "tool_use":
            try:
                block["input"] = json.loads(block.pop("partial", "") or "{}")
            except json.JSONDecodeError:
                block["input"] = {}
    return first or 0.0, usage, blocks


def conversation(url: str, key: str, model: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": USER_TURNS[0]}]
    rows = []
    for turn in range(TURNS):
        body = {
            "model": model, "max_tokens": 24, "temperature": 0, "stream": True,
            "system": system_blocks(turn), "tools": tool_list(), "messages": messages,
            "metadata": {"user_id": "bench"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
        ttft, usage, blocks = stream_turn(url, key, body)
        prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        cached = usage.get("cache_read_input_tokens", 0)
        rows.append({"turn": turn + 1, "prompt_tokens": prompt, "cached_tokens": cached,
                     "hit_rate": cached / prompt if prompt else 0.0, "ttft_s": ttft})
        messages.append({"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]})
        calls = [b for b in blocks if b["type"] == "tool_use"]
        # The agent's loop: results for its calls, else the user's next request.
        if calls:
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c["id"], "content": TOOL_RESULT} for c in calls
            ]})
        elif turn % 2 == 0:
            # As if the assistant had asked for a search: the result comes back.
            messages.append({"role": "user", "content": [{"type": "text", "text": TOOL_RESULT}]})
        else:
            messages.append({"role": "user", "content": USER_TURNS[(turn // 2 + 1) % len(USER_TURNS)]})
    return rows


@contextlib.contextmanager
def daemon_in_thread(model_dir: Path, key: str) -> Iterator[str]:
    from mlxd.daemon.build import build_daemon
    from mlxd.registry.loader import load_registry
    from mlxd.settings import DaemonSettings

    with tempfile.TemporaryDirectory(prefix="mlxd-bench-") as tmp:
        registry = Path(tmp) / "models.yaml"
        registry.write_text(yaml.safe_dump({
            "manager": {"memory_budget": "70%", "cache_dir": str(Path(tmp) / "cache")},
            "server": {"api_keys": [key]},
            "models": [{"name": "local", "path": str(model_dir), "aliases": ["claude-*"], "max_context": 16384}],
        }))
        port = free_port()
        settings = DaemonSettings(config=registry, port=port, state_dir=Path(tmp) / "state", watch_config=False)
        built = build_daemon(settings, load_registry(registry))
        thread = threading.Thread(target=built.server.run, daemon=True)
        thread.start()
        while not built.server.started:
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            built.server.should_exit = True
            thread.join(timeout=60)


def warm(url: str, key: str) -> None:
    """Compile the kernels on another conversation, so turn 1 is not a compile."""
    httpx.post(f"{url}/v1/messages", headers={"x-api-key": key}, timeout=600,
               json={"model": "local", "max_tokens": 4, "messages": [{"role": "user", "content": "warm up"}]})


def run(size: str) -> dict[str, Any]:
    from tools.tool_models import with_template

    from mlxd.api.anthropic import normalise
    from mlxd.factory import ModelRecipe, build_model

    key = "sk-bench"
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = with_template(build_model(ModelRecipe("qwen2", size)), Path(tmp) / "model")
        normalising = normalise.without_billing_header
        for mode in ("without", "with"):
            normalise.without_billing_header = normalising if mode == "with" else (lambda text: text)
            try:
                with daemon_in_thread(model, key) as url:
                    warm(url, key)
                    results[mode] = conversation(url, key, "claude-sonnet-4-5")
            finally:
                normalise.without_billing_header = normalising
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    args = parser.parse_args()
    reexec_with_openblas()
    results = run(args.size)
    rows = []
    for a, b in zip(results["without"], results["with"]):
        rows.append([
            a["turn"], a["prompt_tokens"],
            f"{a['cached_tokens']} ({a['hit_rate']:.0%})", f"{a['ttft_s']:.3f}",
            f"{b['cached_tokens']} ({b['hit_rate']:.0%})", f"{b['ttft_s']:.3f}",
        ])
    total = {m: sum(r["cached_tokens"] for r in results[m][1:]) / max(1, sum(r["prompt_tokens"] for r in results[m][1:]))
             for m in results}
    print(f"{TURNS}-turn agent conversation on /v1/messages, {args.size} model, billing line changing every turn\n")
    print(table(["turn", "prompt", "cached, without", "TTFT s, without", "cached, with", "TTFT s, with"], rows))
    print(f"\nturns 2-{TURNS}: cached share of the prompt {total['without']:.0%} without the normalisation, "
          f"{total['with']:.0%} with it")
    path = save("agent_turns", args.size, {"environment": environment(), "turns": results, "hit_rate_turns_2_on": total})
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
