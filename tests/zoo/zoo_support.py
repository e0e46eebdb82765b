"""Shared pieces of the zoo tests (imported as ``zoo.zoo_support``): the
families, their built folders, and what plain mlx-lm makes of them.

The cache and thinking lanes' tests reuse ``zoo_model`` / ``TEXT_FAMILIES``
(and the conftest's per-family fixtures) to run their paths on every family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxd.factory.zoo import FAMILIES, Family
from mlxd.factory.zoo_build import build_family

TEXT_FAMILIES = tuple(n for n, f in FAMILIES.items() if not f.vision)
VISION_FAMILIES = tuple(n for n, f in FAMILIES.items() if f.vision)

# Real text, not repeated words: a repetitive prompt can make a random model stop at once.
CHAT = [{"role": "user", "content": "Read the configuration file and report the options"}]


def family(name: str) -> Family:
    return FAMILIES[name]


def zoo_model(name: str) -> Path:
    """The family's model folder (built once per content hash, in the factory cache)."""
    return build_family(name)


def mlx_lm_greedy(path: Path, messages: list[dict[str, Any]], max_tokens: int, **template_kwargs: Any) -> str:
    """What plain mlx-lm answers greedily: its own load, template and generate."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(path))
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)


def batch_name(name: str) -> str:
    return f"{name}-batch"


def registry_entries(paths: dict[str, Path]) -> list[dict[str, Any]]:
    """models.yaml entries serving every family: single path under its name,
    the batching path under ``NAME-batch`` (text families)."""
    entries = []
    for name, path in paths.items():
        entries.append({"name": name, "path": str(path)})
        if not FAMILIES[name].vision:
            entries.append({"name": batch_name(name), "path": str(path), "max_concurrency": 4})
    return entries


def chat(daemon: Any, model: str, messages: list[dict[str, Any]], **body: Any) -> Any:
    """POST /v1/chat/completions, greedy unless told; the httpx response."""
    import httpx

    payload = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 24, **body}
    return httpx.post(f"{daemon.url}/v1/chat/completions", json=payload, timeout=120)


def answer_text(message: dict[str, Any]) -> str:
    """The text the model wrote: reasoning (where a surface separates it) then content."""
    return (message.get("reasoning_content") or message.get("reasoning") or "") + (message.get("content") or "")
