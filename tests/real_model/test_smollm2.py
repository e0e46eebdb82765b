"""SmolLM2-135M-Instruct, a trained model imported from its GGUF file (as the
demo serves it on this device), through a real ``mlxd serve`` over HTTP: a
real tokenizer, chat template and weights come through the daemon intact.

The model decodes at a few tokens a second on a CPU: one daemon serves the
whole module and every request asks for a dozen tokens or so.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from mlxd.dtypes import device_dtype
from mlxd.factory.smollm2 import smollm2_gguf
from mlxd.gguf.cache import converted_dir
from support.daemon import Daemon, daemon_process

pytestmark = [pytest.mark.mlx, pytest.mark.slow]

NAME = "smollm2"
CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


class Served:
    """The module's daemon, restartable on the same registry and cache."""

    def __init__(self, registry: Path, tmp: Path) -> None:
        self.registry, self.tmp = registry, tmp
        self._stack = contextlib.ExitStack()
        self.daemon: Daemon = self._start()

    def _start(self) -> Daemon:
        return self._stack.enter_context(daemon_process(self.registry, self.tmp))

    def restart(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self.daemon = self._start()

    def close(self) -> None:
        self._stack.close()

    def chat(self, messages: list[dict], **fields) -> dict:
        body = {"model": NAME, "messages": messages, "temperature": 0, "max_tokens": 16, **fields}
        reply = httpx.post(f"{self.daemon.url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def stream(self, messages: list[dict], **fields) -> tuple[str, str]:
        body = {"model": NAME, "messages": messages, "temperature": 0, "max_tokens": 16,
                "stream": True, **fields}
        pieces, finish = [], None
        with httpx.stream("POST", f"{self.daemon.url}/v1/chat/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line.removeprefix("data: "))["choices"][0]
                pieces.append(choice["delta"].get("content") or "")
                finish = choice.get("finish_reason") or finish
        return "".join(pieces), finish


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    # The weights the demo serves on this device: float32 on a CPU, where the
    # quantized kernels are slow (a load's warm-up alone took 40-90 s), the
    # file's Q4_1 on GPUs and Metal.
    dtype = "float32" if device_dtype() == "float32" else "keep"
    return converted_dir(smollm2_gguf(), tmp_path_factory.mktemp("gguf-cache"), dtype=dtype)


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("smollm2")
    registry = tmp / "models.yaml"
    registry.write_text(yaml.safe_dump({
        "manager": {"memory_budget": "2GB", "cache_dir": str(tmp / "cache")},
        "models": [{"name": NAME, "path": str(model_dir), "max_context": 2048, "max_concurrency": 2}],
    }))
    daemon = Served(registry, tmp)
    yield daemon
    daemon.close()


def content(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def cached(reply: dict) -> int:
    return (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def test_greedy_answer_is_mlx_lm_generate_and_makes_sense(served, model_dir):
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(model_dir))
    prompt = tokenizer.apply_chat_template(CAPITAL, add_generation_prompt=True)
    direct = mlx_lm.generate(model, tokenizer, prompt, max_tokens=16)

    reply = served.chat(CAPITAL)
    assert content(reply) == direct == "The capital of France is Paris."
    # <|im_end|>, the template's end of turn, ended it before max_tokens.
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] < 16
    assert reply["usage"]["prompt_tokens"] == len(prompt)


def test_same_answer_cold_warm_restored_and_after_restart(served):
    # Its own system prompt: the template's default one is cached by other tests.
    question = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    cold = served.chat(question, max_tokens=8)
    # Only the template's first tokens (<|im_start|>system) can be shared.
    assert cached(cold) <= 4
    whole_prompt = cold["usage"]["prompt_tokens"] - 1

    warm = served.chat(question, max_tokens=8)
    assert (content(warm), cached(warm) >= whole_prompt) == (content(cold), True)

    unloaded = httpx.post(f"{served.daemon.url}/v1/models/{NAME}/unload", json={}, timeout=120)
    assert unloaded.json()["state"] == "unloaded"
    restored = served.chat(question, max_tokens=8)
    assert (content(restored), cached(restored) >= whole_prompt) == (content(cold), True)

    served.restart()
    again = served.chat(question, max_tokens=8)
    assert (content(again), cached(again) >= whole_prompt) == (content(cold), True)
    assert served.daemon.model(NAME)["prefix_cache"]["restored_entries"] >= 1


def test_stream_reassembles_byte_exactly_with_multibyte_text(served):
    question = [{"role": "user", "content": "Write the French words café, crème brûlée and naïve."}]
    whole = served.chat(question, max_tokens=20)
    streamed, finish = served.stream(question, max_tokens=20)
    text = content(whole)
    assert any(ord(ch) > 127 for ch in text), text  # the answer does hold multi-byte characters
    assert streamed.encode() == text.encode()
    assert finish == whole["choices"][0]["finish_reason"]


def test_stop_strings_and_max_tokens_end_where_they_should(served):
    full = content(served.chat(CAPITAL))
    assert "Paris" in full

    stopped = served.chat(CAPITAL, stop=["Paris"])
    assert content(stopped) == full[: full.index("Paris")]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    streamed, finish = served.stream(CAPITAL, stop=["Paris"])
    assert (streamed, finish) == (content(stopped), "stop")

    short = served.chat(CAPITAL, max_tokens=3)
    assert short["choices"][0]["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 3
    assert full.startswith(content(short)) and len(content(short)) < len(full)


def test_the_demo_registry_serves_smollm2_as_default(tmp_path):
    import mlx.core as mx
    import mlx_lm

    from mlxd.cli.demo import is_stale, write_demo
    from mlxd.registry.loader import load_registry

    # A CPU demo: imported once into the demo's own folder, dequantized to
    # float32 (the only matrix products MLX's CPU backend runs through BLAS).
    path = write_demo(tmp_path / "demo", sizes=("tiny",), dtype="float32")
    default = next(m for m in load_registry(path).models if "default" in m.aliases)
    assert default.name == "smollm2-135m"
    assert default.path.parent == tmp_path.resolve() / "demo" / "models" / "gguf"
    assert "float32" in default.path.name and default.defaults.temperature == 0
    config = json.loads((default.path / "config.json").read_text())
    assert "quantization" not in config and config["torch_dtype"] == "float32"
    weights = mx.load(str(default.path / "model.safetensors"))
    assert {v.dtype for v in weights.values()} == {mx.float32} and not any(n.endswith(".scales") for n in weights)
    written = (default.path / "model.safetensors").stat().st_mtime_ns
    write_demo(tmp_path / "demo", sizes=("tiny",), dtype="float32")
    assert (default.path / "model.safetensors").stat().st_mtime_ns == written  # not imported again

    # Dequantizing changes no greedy answer the docs and tests quote.
    model, tokenizer = mlx_lm.load(str(default.path))
    prompt = tokenizer.apply_chat_template(CAPITAL, add_generation_prompt=True)
    assert mlx_lm.generate(model, tokenizer, prompt, max_tokens=16) == "The capital of France is Paris."

    # A bf16 demo (GPUs, Metal, with fast quantized kernels) names the file,
    # which the registry converts keeping it quantized.
    gpu = write_demo(tmp_path / "gpu", sizes=("tiny",), dtype="bfloat16")
    quantized = next(m for m in load_registry(gpu).models if "default" in m.aliases)
    assert quantized.source.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert json.loads((quantized.path / "config.json").read_text())["quantization"]["bits"] == 4

    # `mlxd serve` rebuilds a demo registry an older mlxd wrote (its default
    # was a random model, then the quantized file on every device), never one
    # written by hand.
    assert not is_stale(path)
    older = tmp_path / "older.yaml"
    older.write_text("# The mlxd demo registry: small real models made offline by `mlxd demo`.\nmodels: []\n")
    quantized_everywhere = tmp_path / "v2.yaml"
    quantized_everywhere.write_text("# The mlxd demo registry (version 2): SmolLM2 (from a GGUF file) and small "
                                    "models made offline by `mlxd demo`.\nmodels: []\n")
    own = tmp_path / "own.yaml"
    own.write_text("models: []\n")
    assert is_stale(older) and is_stale(quantized_everywhere) and not is_stale(own)
