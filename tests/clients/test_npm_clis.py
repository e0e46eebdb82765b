"""OpenCode, Qwen Code, pi and Continue CLI, each run once as its own docs
say with the settings docs/clients.md shows (read from it; URL and model
swapped in), against the demo registry as
`mlxd demo` writes it. ``scripts/setup.sh --tests`` installs them from npm
into ``.agents/`` at the versions below; each gets its own HOME.

Each asks for the demo's ``qwen-tiny`` with a 64-token answer cap and sends
its own tools on the turn (mlxd writes them into the prompt: the plain
ChatML template has no place for them). SmolLM2 would answer sensibly but
prefills an agent's ~8k-token prompt in minutes on a loaded CPU. Qwen
Code's own system prompt and tools come to ~23k tokens, past the tiny
model's 16k window (mlxd answers 400 and says so), so its run replaces the
system prompt and keeps two core tools (`--bare`), as the Claude Code test does.

Each run also makes the model call the client's file-reading tool once, and
checks that the client parsed mlxd's streamed call, ran it and answered with
its result: pi through its extension hook, the others (which have no
setting for ``tool_choice``) through ``forcing_proxy.py``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from clients.forcing_proxy import MARKER, ForcingProxy, assert_client_ran_the_call

pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen-tiny"
PROMPT = "Say hello"
DOC = (ROOT / "docs" / "clients.md").read_text()
DOC_URL, DOC_MODEL = "http://127.0.0.1:8080", "default"


def doc_block(language: str, containing: str, url: str) -> str:
    """The docs' ``language`` block that mentions ``containing``, for ``url`` and MODEL."""
    block = next(b for b in re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S) if containing in b)
    return block.replace(DOC_URL, url).replace(f'"{DOC_MODEL}"', f'"{MODEL}"').replace(f": {DOC_MODEL}\n", f": {MODEL}\n")


def small_window(config: str) -> str:
    """The docs' context and output sizes, cut to the tiny model's (16k window, 64-token answers)."""
    config = re.sub(r'("?output"?|"?maxTokens"?): \d+', r"\1: 64", config)
    return re.sub(r'("context"|"contextWindow"): \d+', r"\1: 16384", config)


def cli(name: str) -> str:
    found = shutil.which(name, path=str(ROOT / ".agents" / "node_modules" / ".bin"))
    if found:
        return found
    if shutil.which("node") is None:
        pytest.skip(f"node is not installed, so `{name}` cannot be (install Node 20+, then scripts/setup.sh --tests)")
    pytest.fail(f"`{name}` is not installed: run scripts/setup.sh --tests (it installs it with npm)")


def run_cli(home: Path, command: list[str], *, says_something: bool = True, **extra: str) -> str:
    """Run one CLI turn in ``home`` (its HOME and working folder); its output.
    ``says_something``: the turn must print an answer (a random model's answer
    after a tool result may be empty: greedy text after a prefix-cache hit can
    differ from a cold one in its last bits, and so in its first token)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    run = subprocess.run(
        command, # PWD too: OpenCode reads its project folder (and opencode.json) from it, not from the cwd.
        env={**env, "HOME": str(home), "PWD": str(home), **extra}, cwd=home, capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert "API Error" not in output, output[-3000:]
    assert run.stdout.strip() or not says_something, output[-3000:]
    return output


def cold_cache(daemon) -> None:
    """Start from a cold prompt cache, as when the test runs alone: a random
    model's greedy answer after other CLIs' cached turns can come out
    otherwise (bf16 numerics differ between a cached and a cold prefill),
    and an uncapped one can then run for thousands of tokens."""
    cleared = httpx.delete(f"{daemon.url}/v1/cache/prefix", params={"model": MODEL}, timeout=60)
    assert cleared.status_code == 200, cleared.text


def turns_since(daemon, seen: int) -> list[tuple[int, int]]:
    """(tokens_in, tokens_out) of the chat requests for MODEL logged after the first ``seen`` characters."""
    pattern = re.compile(rf"chat model={MODEL} status=200 tokens_in=(\d+) tokens_out=(\d+)")
    log = daemon.log(until=lambda text: pattern.search(text, seen))
    return [(int(i), int(o)) for i, o in pattern.findall(log[seen:])]


def assert_tools_went_through(daemon, seen: int, capped: bool = True) -> None:
    turns = turns_since(daemon, seen)
    assert turns, daemon.log()[-3000:]
    # The client's tool schemas were written into the prompt (a bare "Say hello" is ~20 tokens),
    # and the answer cap it sent was kept. Only that turn: pi also sends a short request of its
    # own (~500 tokens in) without the model's maxTokens.
    tokens_in, tokens_out = max(turns)
    assert tokens_in > 1500, turns
    assert not capped or tokens_out <= 64, turns


def test_opencode_runs_a_turn_and_a_parsed_tool_call(demo, workdir):
    opencode = cli("opencode")
    with ForcingProxy(demo.url, "read", str(workdir / "note.txt")) as proxy:
        config = json.loads(small_window(doc_block("json", "@ai-sdk/openai-compatible", proxy.url)))
        assert config["provider"]["mlxd"]["models"][MODEL]["limit"]["output"] == 64
        (workdir / "opencode.json").write_text(json.dumps(config))
        cold_cache(demo)
        seen = len(demo.log())
        run_cli(workdir, [opencode, "run", "--model", f"mlxd/{MODEL}", PROMPT])
    assert_client_ran_the_call(proxy, MARKER)
    assert_tools_went_through(demo, seen)


def test_qwen_code_runs_a_turn_and_a_parsed_tool_call(demo, workdir):
    qwen = cli("qwen")
    # --bare (which keeps the prompt to the tools asked for) reads no settings.json, so
    # Qwen Code asks for 32,768 tokens, more than the window: the proxy cuts that to the
    # others' 64 (a random model's greedy answer after the tool result ran to 2,421
    # tokens, and an uncapped one under load outlasted the 300 s limit in a full run).
    with ForcingProxy(demo.url, "read_file", str(workdir / "note.txt"), cap=64) as proxy:
        block = doc_block("sh", "--auth-type openai", proxy.url)
        exports = dict(word.split("=", 1) for word in block.split("\n")[0].removeprefix("export ").split())
        assert shlex.split(block.split("\n")[1]) == ["qwen", "--auth-type", "openai", "-p", PROMPT]
        assert exports["OPENAI_MODEL"] == DOC_MODEL
        exports["OPENAI_MODEL"] = MODEL
        cold_cache(demo)
        seen = len(demo.log())
        run_cli(
            workdir,
            [qwen, "--auth-type", "openai", "--bare", "--system-prompt", "You are a terse assistant.",
             "--core-tools", "read_file", "--core-tools", "run_shell_command", "-p", PROMPT],
            says_something=False, **exports,
        )
    assert_client_ran_the_call(proxy, MARKER)
    assert_tools_went_through(demo, seen)


# pi's own request log: an extension of the test's, loaded after the docs' one, sees the payload as sent.
RECORDER = """import { appendFileSync } from "node:fs";
export default function (pi: any) {
  pi.on("before_provider_request", (event: any) => { appendFileSync(process.env.HOME + "/sent.jsonl", JSON.stringify(event.payload) + "\\n"); });
}
"""


# A random model writes a forced call's strings and numbers until it happens
# to close them: pinned, the prompt (pi's system prompt carries today's date
# and the working directory) was the same on every run and so was the call,
# until a CI run's call ran past maxTokens inside its arguments all the same.
# So the call is bounded by its schema, as the grammar enforces it: `read`
# takes a path of at most 24 characters and none of its optional numbers
# (whose digits a random model does not end either). pi still validates the
# call against its own schema, which such a call meets.
PIN_PROMPT = """export default function (pi: any) {
  pi.on("before_provider_request", (event: any) => {
    const payload = event.payload as any;
    const pin = (text: string) => text
      .replace(/Current date: .*/, "Current date: 2026-01-05")
      .replace(/Current working directory: .*/, "Current working directory: /work/project");
    const messages = payload.messages.map((m: any) =>
      typeof m.content === "string" && (m.role === "system" || m.role === "developer")
        ? { ...m, content: pin(m.content) } : m);
    const bounded = (tool: any) => tool.function?.name !== "read" ? tool : { ...tool, function: {
      ...tool.function,
      parameters: { type: "object", required: ["path"], properties: {
        path: { ...tool.function.parameters.properties.path, maxLength: 24 } } } } };
    return { ...payload, messages, tools: payload.tools?.map(bounded) };
  });
}
"""


def test_pi_runs_a_forced_tool_call_and_answers(demo, tmp_path):
    pi = cli("pi")
    models = json.loads(small_window(doc_block("json", "openai-completions", demo.url)))
    assert models["providers"]["mlxd"]["models"][0]["id"] == MODEL
    models["providers"]["mlxd"]["models"][0]["maxTokens"] = 256  # as the docs say for a forced call
    extensions = tmp_path / ".pi" / "agent" / "extensions"
    extensions.mkdir(parents=True)
    (tmp_path / ".pi" / "agent" / "models.json").write_text(json.dumps(models))
    (extensions / "force-read.ts").write_text(doc_block("typescript", "before_provider_request", demo.url))
    (extensions / "zy-pin-prompt.ts").write_text(PIN_PROMPT)
    (extensions / "zz-record.ts").write_text(RECORDER)
    # The forced call comes from a random model under greedy decoding: after another
    # CLI's turns had cached part of it, its arguments came out otherwise and pi did not run it.
    cold_cache(demo)
    seen = len(demo.log())
    run_cli(tmp_path, [pi, "-p", "--provider", "mlxd", "--model", MODEL, PROMPT], says_something=False)
    sent = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]
    answered = [p for p in sent if p.get("tools") and p["messages"][-1]["role"] == "tool"]
    assert answered, [p["messages"][-1] for p in sent]
    # pi parsed mlxd's call: it sends it back as its own assistant turn, arguments an
    # object its `read` schema takes, and the result of running it under the call's id.
    *_, call_turn, result = answered[0]["messages"]
    (call,) = call_turn["tool_calls"]
    assert call["function"]["name"] == "read"
    arguments = json.loads(call["function"]["arguments"])
    read = next(t["function"]["parameters"] for t in answered[0]["tools"] if t["function"]["name"] == "read")
    assert set(read["required"]) <= set(arguments) <= set(read["properties"]), arguments
    assert result["tool_call_id"] == call["id"] and result["content"], result
    # Then the model's own answer, unforced, ended the turn (pi's exit is checked by run_cli).
    assert len(answered) == 1, [p["messages"][-1]["role"] for p in sent]
    assert_tools_went_through(demo, seen, capped=False)
    # Its maxTokens held on both tool turns (the side request of its own, a few hundred tokens in, has none).
    assert all(o <= 256 for i, o in turns_since(demo, seen) if i > 1500), turns_since(demo, seen)


def test_continue_cli_runs_a_turn_and_a_parsed_tool_call(demo, workdir):
    cn = cli("cn")
    with ForcingProxy(demo.url, "Read", str(workdir / "note.txt")) as proxy:
        config = workdir / "config.yaml"
        config.write_text(small_window(doc_block("yaml", "apiBase", proxy.url)))
        assert f"model: {MODEL}\n" in config.read_text() and "maxTokens: 64" in config.read_text()
        cold_cache(demo)
        seen = len(demo.log())
        run_cli(workdir, [cn, "-p", "--config", str(config), PROMPT], says_something=False)
    assert_client_ran_the_call(proxy, MARKER)
    assert_tools_went_through(demo, seen)
