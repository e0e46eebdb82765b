"""Prefix-cache reads and time to first token over a coding-agent
conversation that searches for tools, as Claude Code 2.1.337 does: a few
tools listed, the rest deferred (``defer_loading: true``, named in a
reminder), a ``ToolSearch`` call every other turn whose result names the
tool it found in a ``tool_reference`` block, the found tool then sent in
``tools``, still deferred.

Two ways, in one run, over the same turns:

- ``deferred``: the bodies as Claude Code sends them. mlxd keeps deferred
  tools out of the prompt's tool list and writes what a search found into
  its tool result, so each turn's prompt begins with the one before.
- ``listed``: the same bodies without ``defer_loading``, which is what a
  server that ignores the flag makes of them (mlxd before it honoured it):
  every tool in the list at the head of the prompt, which grows with each
  search, so the turn after a search prefills the conversation again.

The searches are written into the history by the bench (the tiny model's
own answers would not call ToolSearch); the other assistant turns are what
the model answers (greedy).

    python bench/tool_search.py                # tiny factory model
    python bench/tool_search.py --size small

Prints a table and writes bench/results/tool_search.json. Timing only:
nothing passes or fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


from bench.agent_turns import daemon_in_thread, stream_turn, system_blocks, warm  # noqa: E402
from bench.common import ROOT, environment, reexec_with_openblas, save, table  # noqa: E402

TURNS = 9


def _tool(name: str, text: str, params: dict[str, str], deferred: bool = False) -> dict[str, Any]:
    tool = {"name": name, "description": text, "input_schema": {
        "type": "object", "properties": {k: {"type": v} for k, v in params.items()}, "required": [next(iter(params))]}}
    return {**tool, "defer_loading": True} if deferred else tool


LISTED = [
    _tool("ToolSearch", "Fetches full schema definitions for deferred tools so they can be called. Query "
          "\"select:<name>\" to load a tool by name.", {"query": "string", "max_results": "number"}),
    _tool("Bash", "Run a shell command in the project and return its output.", {"command": "string", "timeout": "integer"}),
    _tool("Read", "Read a file from the project, optionally a range of lines.", {"file_path": "string", "offset": "integer"}),
    _tool("Edit", "Replace an exact string in a file with another.",
          {"file_path": "string", "old_string": "string", "new_string": "string"}),
    _tool("Write", "Write a whole file.", {"file_path": "string", "content": "string"}),
]
PLACEHOLDER = _tool("DeferredToolPlaceholder", "Reserved placeholder that keeps deferred tool loading active; "
                    "never call this tool.", {"unused": "string"}, deferred=True)
# The deferred tools the conversation's searches find, one per search, in order.
FOUND = [
    _tool("WebFetch", "Fetch a URL and answer a question about its content, reading the page as markdown.",
          {"url": "string", "prompt": "string"}, deferred=True),
    _tool("NotebookEdit", "Replace, insert or delete a cell of a Jupyter notebook.",
          {"notebook_path": "string", "cell_id": "string", "new_source": "string", "edit_mode": "string"}, deferred=True),
    _tool("TaskCreate", "Create a task in the session's task list, with a subject and a description.",
          {"subject": "string", "description": "string", "activeForm": "string"}, deferred=True),
    _tool("CronCreate", "Schedule a prompt to run on a cron schedule, once or recurring.",
          {"cron": "string", "prompt": "string", "recurring": "boolean"}, deferred=True),
]
REMINDER = ("<system-reminder>\nThe following deferred tools are now available via ToolSearch. Their schemas are "
            "NOT loaded. Use ToolSearch with query \"select:<name>\" to load tool schemas before calling them:\n"
            + "\n".join(t["name"] for t in FOUND) + "\n</system-reminder>")
ASKS = [
    "Fetch the release notes page and tell me what changed in the last version.",
    "Now add a notebook cell that plots the numbers you found.",
    "Track this as a task so I remember to review it.",
    "Schedule a check of the page every morning.",
    "Summarise what we did.",
]


def _search(turn: int, found: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant's ToolSearch call and its result, as Claude Code writes them."""
    call_id = f"toolu_search{turn:02d}"
    return [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": call_id, "name": "ToolSearch", "input": {"query": f"select:{found['name']}"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id,
             "content": [{"type": "tool_reference", "tool_name": found["name"]}]},
            {"type": "text", "text": "Tool loaded."}]},
    ]


def conversation(url: str, key: str, honour_deferral: bool) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": REMINDER}, {"type": "text", "text": ASKS[0]}]}]
    found: list[dict[str, Any]] = []
    rows = []
    for turn in range(TURNS):
        searched = turn % 2 == 1 and len(found) < len(FOUND)
        if searched:
            found.append(FOUND[len(found)])
            messages += _search(turn, found[-1])
        # A found tool joins the list inside it, as Claude Code's (in name order) does.
        tools = [*LISTED[:1], *found, *LISTED[1:], PLACEHOLDER]
        if not honour_deferral:
            tools = [{k: v for k, v in t.items() if k != "defer_loading"} for t in tools]
        body = {"model": "claude-sonnet-4-5", "max_tokens": 16, "temperature": 0, "stream": True,
                "system": system_blocks(0), "tools": tools, "messages": messages,
                "thinking": {"type": "disabled"}}
        ttft, usage, blocks = stream_turn(url, key, body)
        prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        cached = usage.get("cache_read_input_tokens", 0)
        rows.append({"turn": turn + 1, "searched": searched,
                     "prompt_tokens": prompt, "cached_tokens": cached, "ttft_s": ttft})
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text") or "..."
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        messages.append({"role": "user", "content": ASKS[(turn // 2 + 1) % len(ASKS)]})
    return rows


def run(size: str) -> dict[str, Any]:
    from tools.tool_models import with_template

    from mlxd.factory import ModelRecipe, build_model

    key = "sk-bench"
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = with_template(build_model(ModelRecipe("qwen2", size)), Path(tmp) / "model")
        for mode, honour in (("listed", False), ("deferred", True)):
            with daemon_in_thread(model, key) as url:
                warm(url, key)
                results[mode] = conversation(url, key, honour)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    args = parser.parse_args()
    reexec_with_openblas()
    results = run(args.size)
    rows = []
    for a, b in zip(results["listed"], results["deferred"]):
        rows.append([a["turn"], "search" if a["searched"] else "",
                     f"{a['cached_tokens']}/{a['prompt_tokens']}", f"{a['ttft_s']:.3f}",
                     f"{b['cached_tokens']}/{b['prompt_tokens']}", f"{b['ttft_s']:.3f}"])
    totals = {m: {"cached": sum(r["cached_tokens"] for r in results[m][1:]),
                  "prompt": sum(r["prompt_tokens"] for r in results[m][1:]),
                  "ttft_s": sum(r["ttft_s"] for r in results[m][1:])} for m in results}
    print(f"{TURNS}-turn agent conversation with a tool search every other turn, {args.size} model\n")
    print(table(["turn", "", "cached/prompt, listed", "TTFT s, listed", "cached/prompt, deferred", "TTFT s, deferred"],
                rows))
    for mode, t in totals.items():
        print(f"turns 2-{TURNS}, {mode}: {t['cached']:,} of {t['prompt']:,} prompt tokens from the cache "
              f"({t['cached'] / max(1, t['prompt']):.0%}), TTFT {t['ttft_s']:.2f} s in all")
    path = save("tool_search", args.size, {"environment": environment(), "turns": results, "totals": totals})
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
