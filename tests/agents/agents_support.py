"""What the agent-surface tests share (imported as ``agents.agents_support``):
a daemon with a plain tiny model, one whose template has tools, the tiny
vision model and an API key."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from support.daemon import Daemon, daemon_in_thread, tiny_model, wait_until, write_registry
from tools.tool_models import with_template
from vision.vision_support import tiny_vision_model

KEY = "sk-agents-test"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
PROMPT = "Read the configuration file and report the errors"


@contextlib.contextmanager
def agents_daemon(tmp: Path, **settings) -> Iterator[Daemon]:
    tooly = with_template(tiny_model("qwen"), tmp / "qwen-tools")
    registry = write_registry(
        tmp,
        [
            # Tool calling off: the refusal tests' model.
            {"name": "qwen", "model": "qwen", "max_concurrency": 1, "tool_parser": "none"},
            {"name": "tooly", "path": str(tooly), "max_concurrency": 2},
            {"name": "eyes", "path": str(tiny_vision_model())},
            # Only ever counted before it is asked to answer.
            {"name": "eyes-counted", "path": str(tiny_vision_model())},
            {"name": "counted", "path": str(tooly)},
            # One at a time and nobody waits: the second request is turned away.
            {"name": "narrow", "model": "qwen", "max_concurrency": 1, "max_queue": 0, "preload": True},
        ],
        server={"api_keys": [KEY]},
    )
    with daemon_in_thread(registry, tmp, **settings) as d:
        yield d


def model_view(daemon: Daemon, name: str) -> dict:
    """The model's entry in /v1/status (the key is required there too)."""
    status = httpx.get(f"{daemon.url}/v1/status", headers={"authorization": f"Bearer {KEY}"}, timeout=10).json()
    return next(m for m in status["models"] if m["name"] == name)


@contextlib.contextmanager
def model_held(daemon: Daemon, name: str) -> Iterator[None]:
    """A streamed generation holds ``name``'s only slot while the block runs;
    leaving the block hangs up, which frees the slot.

    A fixed-length holder was a race: on a quiet machine the tiny model's
    1,200 tokens could finish inside a test's wait for the slot."""
    import openai

    client = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)
    done = threading.Event()

    def hold() -> None:
        with client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": PROMPT}], max_tokens=30000, stream=True,
            extra_body={"ignore_eos": True},
        ) as stream:
            for _ in stream:
                if done.is_set():
                    return

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        wait_until(lambda: model_view(daemon, name)["active_leases"] >= 1, timeout=30)
        yield
    finally:
        done.set()
        holder.join()
        wait_until(lambda: model_view(daemon, name)["active_leases"] == 0, timeout=30)
