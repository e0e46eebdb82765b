"""Prefix-cache reuse per model family: one agent conversation through mlxd,
`mlx_lm.server` and vllm-mlx in the same run, cached share of the prompt and
time to first token per turn.

The conversation is Claude Code's request shape as ``bench/agent_turns.py``
records it (its long system prompt and tool list, as OpenAI chat completions
so that every server takes it), turn after turn: the history, the answer the
model really gave (greedy) and the next question. The model of each family is
the zoo's (mlxd/factory/zoo.py): a tiny random-weight one built from
mlx-lm's own class with the family's real chat template, so every server runs
the same architecture, cache type and prompt.

    python bench/agent_families.py                         # all families, 4 turns
    python bench/agent_families.py --families qwen3_next gpt_oss --turns 6
    python bench/agent_families.py --mlxd-tree /work/main  # mlxd from another checkout
    python bench/agent_families.py --pause-s 0             # each turn sent the moment the answer ends

vllm-mlx (`bash bench/setup_vllm_mlx.sh`, its own venv) reports no cached
tokens; its column shows time to first token only. Timing only: nothing
passes or fails. Prints a table and writes bench/results/agent_families.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx  # noqa: E402

from bench.agent_turns import TOOL_RESULT, TOOLS, USER_TURNS, system_blocks  # noqa: E402
from bench.common import ROOT, daemon, environment, free_port, reexec_with_openblas, save, table  # noqa: E402
from bench.servers import VLLM_MLX, process_server  # noqa: E402

SERVERS = ("mlxd", "mlx_lm.server", "vllm-mlx")


def chat_tools() -> list[dict[str, Any]]:
    return [{"type": "function", "function": {
        "name": name, "description": text,
        "parameters": {"type": "object", "properties": {k: {"type": v} for k, v in params.items()},
                       "required": [next(iter(params))]}}} for name, text, params in TOOLS]


def system_prompt() -> str:
    # Claude Code's blocks but its per-request billing line (only mlxd's
    # /v1/messages normalises that; this runs on chat completions).
    return "\n\n".join(b["text"] for b in system_blocks(0)[1:])


def stream_chat(url: str, model: str, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "tools": chat_tools(), "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first, text, usage = None, [], {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900,
                      headers={"authorization": "Bearer sk-bench"}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = delta.get("content") or delta.get("reasoning") or delta.get("reasoning_content")
                if piece or delta.get("tool_calls"):
                    first = first or time.perf_counter() - started
                    text.append(piece or "")
            if event.get("usage"):
                usage = event["usage"]
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return {"ttft_s": first or time.perf_counter() - started, "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": cached, "text": "".join(text)}


def conversation(url: str, model: str, turns: int, max_tokens: int, pause_s: float = 0.0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt()},
                                      {"role": "user", "content": USER_TURNS[0]}]
    rows = []
    for turn in range(turns):
        if turn:
            # The tool runs, or the user reads and types: mlxd's between-turn
            # prefill (docs/prefix-cache.md) has this long before the next turn.
            time.sleep(pause_s)
        row = stream_chat(url, model, messages, max_tokens)
        prompt, cached = row["prompt_tokens"], row["cached_tokens"]
        row["share"] = cached / prompt if prompt and cached is not None else None
        rows.append({"turn": turn + 1, **row})
        messages.append({"role": "assistant", "content": row["text"]})
        # The agent's loop: a tool result comes back, or the user asks the next thing.
        nxt = TOOL_RESULT if turn % 2 == 0 else USER_TURNS[(turn // 2 + 1) % len(USER_TURNS)]
        messages.append({"role": "user", "content": nxt})
    if any(r["cached_tokens"] is not None for r in rows):
        # A server that reports cached tokens leaves the field out when there are none.
        for r in rows:
            if r["cached_tokens"] is None:
                r["cached_tokens"], r["share"] = 0, 0.0
    return rows


@contextlib.contextmanager
def server(name: str, model_path: Path, logs: Path, mlxd_tree: Path, vllm: Path, tool_parser: str | None) -> Any:
    """(base URL, model name) of ``name`` serving ``model_path``."""
    if name == "mlxd":
        # A family whose template has no tool format mlx-lm knows: mlx_lm.server
        # renders the tools anyway and parses no calls, mlxd wants a format named.
        entry = {"name": "m", "path": str(model_path), "preload": True, "max_context": 16384,
                 "idle_unload_seconds": 0, "tool_parser": tool_parser or "json_tools"}
        env = {"PYTHONPATH": str(mlxd_tree)}
        with daemon([entry], env=env, log_to=logs / "mlxd.log", cwd=mlxd_tree) as url:
            yield url, "m"
        return
    port = free_port()
    if name == "mlx_lm.server":
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_path), "--port", str(port),
                "--log-level", "WARNING"]
        model = "default_model"
    else:
        argv = [str(vllm), "serve", str(model_path), "--port", str(port), "--served-model-name", "m", "--offline",
                "--continuous-batching"]
        model = "m"
    with process_server(name, argv, port, model, logs):
        yield f"http://127.0.0.1:{port}", model


def run(families: list[str], servers: list[str], turns: int, max_tokens: int, mlxd_tree: Path,
        vllm: Path, pause_s: float = 0.0) -> dict[str, Any]:
    from mlxd.factory.zoo import FAMILIES
    from mlxd.factory.zoo_build import build_family

    results: dict[str, Any] = {}
    for family in families:
        path = build_family(family)
        results[family] = {}
        for name in servers:
            with tempfile.TemporaryDirectory(prefix="mlxd-families-") as tmp:
                try:
                    parser = FAMILIES[family].tool_parser
                    with server(name, path, Path(tmp), mlxd_tree, vllm, parser) as (url, model):
                        # Kernels compile on first use: warm on another conversation.
                        stream_chat(url, model, [{"role": "user", "content": "warm up"}], 4)
                        results[family][name] = conversation(url, model, turns, max_tokens, pause_s)
                        if name == "mlxd":
                            results[family]["mlxd memory"] = cache_memory(url)
                except (RuntimeError, httpx.HTTPError) as exc:
                    results[family][name] = {"error": str(exc)[-500:]}
            print(f"{family} {name}: done", flush=True)
    return results


def cache_memory(url: str) -> dict[str, Any]:
    """What mlxd's prefix cache holds after the conversation (/v1/status)."""
    status = httpx.get(f"{url}/v1/status", timeout=30).json()
    figures = status["models"][0].get("prefix_cache") or {}
    return {k: figures.get(k) for k in ("memory_entries", "memory_bytes", "checkpoint_entries", "checkpoint_bytes")}


def share_2_on(rows: Any) -> float | None:
    if not isinstance(rows, list):
        return None
    pairs = [(r["prompt_tokens"], r["cached_tokens"]) for r in rows[1:]]
    if any(c is None or p is None for p, c in pairs) or not pairs:
        return None
    return sum(c for _, c in pairs) / max(1, sum(p for p, _ in pairs))


def report(results: dict[str, Any], servers: list[str]) -> None:
    for family, by_server in results.items():
        rows = []
        turns = max((len(r) for r in by_server.values() if isinstance(r, list)), default=0)
        for t in range(turns):
            row: list[Any] = [t + 1]
            for name in servers:
                runs = by_server.get(name)
                if not isinstance(runs, list) or t >= len(runs):
                    row += ["error" if isinstance(runs, dict) else "-", "-"]
                    continue
                r = runs[t]
                cached = "n/a" if r["cached_tokens"] is None else f"{r['cached_tokens']} ({r['share']:.0%})"
                row += [f"{r['prompt_tokens']}/{cached}", f"{r['ttft_s']:.3f}"]
            rows.append(row)
        headers = ["turn"] + [h for name in servers for h in (f"{name} prompt/cached", f"{name} TTFT s")]
        print(f"\n{family}")
        print(table(headers, rows))
        shares = {name: share_2_on(by_server.get(name)) for name in servers}
        print("turns 2+: cached share " + ", ".join(
            f"{n} {'n/a' if s is None else f'{s:.1%}'}" for n, s in shares.items()))
        memory = by_server.get("mlxd memory")
        if memory and memory.get("memory_bytes") is not None:
            print(f"mlxd's prefix cache after it: {memory['memory_entries']} entries, "
                  f"{memory['memory_bytes'] / 2**20:.1f} MiB, of which {memory['checkpoint_entries']} checkpoints, "
                  f"{(memory['checkpoint_bytes'] or 0) / 2**20:.1f} MiB")
        for name, runs in by_server.items():
            if isinstance(runs, dict) and "error" in runs:
                print(f"  {name} failed: {runs['error']}")


def main() -> None:
    from mlxd.factory.zoo import FAMILIES

    text = [n for n, f in FAMILIES.items() if not f.vision]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=text, choices=text)
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=list(SERVERS))
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--pause-s", type=float, default=2.0,
                        help="seconds between an answer and the next turn (the tool's or the user's time)")
    parser.add_argument("--mlxd-tree", type=Path, default=ROOT, help="the checkout whose mlxd serves")
    parser.add_argument("--vllm-mlx", type=Path, default=VLLM_MLX, help="the vllm-mlx command")
    args = parser.parse_args()
    reexec_with_openblas()
    servers = list(args.servers)
    if "vllm-mlx" in servers and not args.vllm_mlx.exists():
        print(f"(no vllm-mlx at {args.vllm_mlx}: `bash bench/setup_vllm_mlx.sh` installs it; left out)")
        servers.remove("vllm-mlx")
    load = os.getloadavg()[0]
    results = run(args.families, servers, args.turns, args.max_tokens, args.mlxd_tree.resolve(), args.vllm_mlx,
                  args.pause_s)
    print(f"\n{args.turns}-turn agent conversation (Claude Code's shape, chat completions), tiny models, "
          f"{args.pause_s:g} s between turns; mlxd from {args.mlxd_tree}; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    report(results, servers)
    path = save("agent_families", "tiny", {"environment": environment(), "mlxd_tree": str(args.mlxd_tree),
                                           "servers": servers, "families": results})
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
