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


class References:
    """What plain mlx-lm / mlx-vlm answer greedily, each model loaded once and
    each answer computed once per session (several paths share one)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self._paths = paths
        self._loaded: dict[str, Any] = {}
        self._answers: dict[str, str] = {}

    def text(self, name: str, messages: list[dict[str, Any]], max_tokens: int = 24, **template_kwargs: Any) -> str:
        """mlx-lm's own load, template and generate."""
        import mlx_lm

        def answer() -> str:
            model, tokenizer = self.loaded(name)
            prompt = render(tokenizer, messages, template_kwargs)
            return mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)

        return self._once(("text", name, messages, max_tokens, template_kwargs), answer)

    def answer(self, name: str, messages: list[dict[str, Any]], max_tokens: int = 24, **template_kwargs: Any) -> str:
        """``text`` as mlxd answers it: its reasoning split out (``as_split``), then joined again."""
        return self.split(name, messages, self.text(name, messages, max_tokens, **template_kwargs), **template_kwargs)

    def split(self, name: str, messages: list[dict[str, Any]], text: str, **template_kwargs: Any) -> str:
        return as_split(self.loaded(name)[1], messages, text, **template_kwargs)

    def vision(self, name: str, messages: list[dict[str, Any]], images: list[Any], max_tokens: int = 16) -> str:
        """mlx-vlm's own load, template and stream_generate for messages with ``images``."""
        from mlx_vlm import apply_chat_template, load, stream_generate

        def answer() -> str:
            model, processor = self.loaded(name)
            prompt = apply_chat_template(processor, model.config, messages, num_images=len(images))
            chunks = stream_generate(model, processor, prompt, image=images, max_tokens=max_tokens, temperature=0.0)
            return "".join(r.text for r in chunks)

        import hashlib

        pixels = [hashlib.sha256(image.tobytes()).hexdigest() + str(image.size) for image in images]
        key = ("vision", name, messages, pixels, max_tokens)
        return self._once(key, answer)

    def loaded(self, name: str) -> Any:
        """(model, tokenizer) from mlx_lm.load, or (model, processor) from mlx_vlm.load."""
        if name not in self._loaded:
            if FAMILIES[name].vision:
                from mlx_vlm import load
            else:
                from mlx_lm import load
            self._loaded[name] = load(str(self._paths[name]))
        return self._loaded[name]

    def _once(self, key: Any, answer: Any) -> str:
        import json

        text_key = json.dumps(key, sort_keys=True, default=str)
        if text_key not in self._answers:
            self._answers[text_key] = answer()
        return self._answers[text_key]


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


def as_split(tokenizer: Any, messages: list[dict[str, Any]], text: str, **template_kwargs: Any) -> str:
    """mlx-lm's ``text`` as mlx_lm.server splits it into reasoning and
    content, joined as ``answer_text`` joins them: the think markers out
    (mlx-lm's TextStateMachine, started inside the reasoning when the prompt
    opened it). ``tokenizer``: mlx-lm's TokenizerWrapper of the model."""
    from mlx_lm.generate import TextStateMachine

    if not tokenizer.has_thinking:
        return text
    prompt = render(tokenizer, messages, template_kwargs)
    opened = tokenizer.rfind_think_start(prompt) > tokenizer.rfind_think_end(prompt)
    machine = TextStateMachine({"normal": [(tokenizer.think_start, "reasoning")],
                                "reasoning": [(tokenizer.think_end, "normal")]})
    state, pieces = TextStateMachine.split(machine.make_state("reasoning" if opened else "normal"), text)
    _, held, last = TextStateMachine.flush(state)
    pieces.append((last, held))
    # As answer_text joins a message: all its reasoning, then its content.
    return "".join(p for s, p in pieces if s == "reasoning") + "".join(p for s, p in pieces if s != "reasoning")


def answer_text(message: dict[str, Any]) -> str:
    """The text the model wrote: reasoning (where a surface separates it) then content."""
    return (message.get("reasoning_content") or message.get("reasoning") or "") + (message.get("content") or "")


def zoo_spec(name: str, **overrides: Any) -> Any:
    """A ModelSpec for the family, for engine-level tests
    (``load_text_engine(zoo_spec("qwen3_next", max_concurrency=4), worker)``)."""
    from mlxd.registry.model import ModelSpec

    path = zoo_model(name)
    kind = "vision" if FAMILIES[name].vision else "text"
    return ModelSpec(name=name, path=path, source=str(path), kind=kind, **overrides)


def render(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any]) -> Any:
    """The family's template on ``messages``; tools on a template with no
    place for them written into the turns, as mlxd does (mlxd.tools.fallback)."""
    from mlxd.tools import fallback

    tools = template_kwargs.get("tools")
    if tools and not fallback.renders_tools(tokenizer.chat_template):
        rest = {k: v for k, v in template_kwargs.items() if k != "tools"}
        return tokenizer.apply_chat_template(fallback.fold(messages, tools), add_generation_prompt=True, **rest)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
