"""The built-in demo registry: a few small real models and a models.yaml naming
them, what `mlxd demo` writes and a bare `mlxd serve` serves. It composes the
factory's models with a GGUF import, so it lives above both.

The default model is SmolLM2-135M-Instruct, a trained model whose answers make
sense: its GGUF file (Q4_1) comes from a PyPI wheel (mlxd.factory.smollm2). On
GPUs and Metal the registry names the file and converts it on first read,
quantized (a ``path:`` may name a ``.gguf`` file). For a float32 demo (a Linux
CPU) it is imported once, dequantized, into the demo's models folder: MLX's
CPU backend runs only float32 matrix products through BLAS, and its quantized
kernels made the demo's first answer (load, warm-up, reply) several times
slower (bench/demo_dtype.py; docs/performance.md has the figures). The others
are the factory's seeded random-weight models the tests use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
from pathlib import Path

from mlxd.factory.build import ModelRecipe, build_model
from mlxd.dtypes import device_dtype
from mlxd.factory.audio import build_soprano, build_whisper
from mlxd.factory.encoders import EncoderRecipe, build_encoder
from mlxd.factory.minilm import minilm_dir
from mlxd.factory.smollm2 import smollm2_gguf
from mlxd.factory.vision import VisionRecipe, build_vision_model
from mlxd.gguf.cache import converted_dir

DEFAULT_MODEL = "smollm2-135m"
# Bump when the demo's models change, so a registry an older mlxd wrote into
# the default demo folder is rebuilt rather than served as it was.
DEMO_VERSION = 5
# The start of every demo registry's first line, whichever version wrote it.
_MARK = "# The mlxd demo registry"
_HEADER = f"{_MARK} (version {DEMO_VERSION}): SmolLM2 (from a GGUF file) and small models made offline by `mlxd demo`."
# The last line: a checksum of the lines above, so a registry someone edited
# (docs point `mlxd demo` at ~/.config/mlxd, "a registry to edit") is theirs.
_SIGNATURE = "# Written by `mlxd demo` (sha256 {}); once edited it is yours: mlxd demo replaces it only with --force."
_SIGNED = _SIGNATURE.split("{}")[0]


def wrote_by_demo(registry: Path) -> bool:
    """Whether ``registry`` is a file :func:`write_demo` wrote (any version)
    and nobody has edited since: one it may replace."""
    return _unedited_demo(_text(registry))


def is_stale(registry: Path) -> bool:
    """Whether ``registry`` was written by an older :func:`write_demo` (a file
    someone wrote or edited there by hand is theirs, and served as it is)."""
    text = _text(registry)
    return _unedited_demo(text) and not text.startswith(_HEADER + "\n")


def _unedited_demo(text: str) -> bool:
    if not text.startswith(_MARK):
        return False
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith(_SIGNED):
        return True  # an older version's, which had no checksum to tell edits by
    return last == _SIGNATURE.format(_checksum(body + "\n"))


def _text(registry: Path) -> str:
    """The registry's text ("" where it cannot be read)."""
    try:
        return registry.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _checksum(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


DEMO_MODELS: tuple[tuple[str, ModelRecipe | VisionRecipe, tuple[str, ...], str], ...] = (
    ("qwen-tiny", ModelRecipe("qwen2", "tiny"), (), "Tiny Qwen2-shaped model with seeded weights"),
    ("llama-tiny", ModelRecipe("llama", "tiny", seed=1), (), "Tiny Llama-shaped model with seeded weights"),
    ("qwen-small", ModelRecipe("qwen2", "small", seed=2), (), "Small Qwen2-shaped model (realistic layer shapes)"),
    ("vision-tiny", VisionRecipe("tiny"), (), "Tiny Qwen2-VL-shaped vision model with seeded weights"),
    ("qwen-bench", ModelRecipe("qwen2", "bench", seed=3), (), "Qwen2.5-0.5B-shaped model with seeded weights"),
)
# `mlxd demo --size S` builds every model up to S.
DEMO_SIZES = ("tiny", "small", "bench")


def sizes_up_to(size: str) -> tuple[str, ...]:
    if size not in DEMO_SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(DEMO_SIZES)}")
    return DEMO_SIZES[: DEMO_SIZES.index(size) + 1]


def _context(name: str) -> int:
    """An agent's prompt needs a long window (Claude Code's and Codex's tools
    alone are ~5k tokens): SmolLM2's trained 8192 (at two slots, so its KV
    cache stays within the budget), the tiny models' 16k of their 32k."""
    return {DEFAULT_MODEL: 8192, "qwen-tiny": 16384, "llama-tiny": 16384}.get(name, 4096)


def _smollm2(directory: Path, models_dir: Path, dtype: str) -> tuple[str, str]:
    """The default model's ``path:`` and description for a demo in ``dtype``."""
    gguf = smollm2_gguf()
    if dtype != "float32":
        # bf16 devices have fast quantized kernels: serve the file as it is.
        return str(gguf), "SmolLM2-135M-Instruct (GGUF Q4_1, kept quantized), a small trained chat model"
    folder = converted_dir(gguf, models_dir, dtype="float32")
    return (str(folder.relative_to(directory)),
            "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to float32, fastest on a CPU), a small trained chat model")


def _encoder_entries(directory: Path, models_dir: Path) -> list[str]:
    """all-MiniLM-L6-v2 (trained, from its PyPI wheel) at /v1/embeddings and
    the factory's tiny random cross-encoder at /v1/rerank; their kinds are
    written out although they would be detected."""
    reranker = build_encoder(EncoderRecipe("rerank"), cache_dir=models_dir)
    return [
        "  - name: minilm",
        f"    path: {minilm_dir()}",
        "    kind: embedding",
        "    aliases: [all-minilm, all-MiniLM-L6-v2, text-embedding-3-small]",
        "    description: all-MiniLM-L6-v2 (sentence-transformers), 384-dimensional sentence embeddings",
        "  - name: rerank-tiny",
        f"    path: {reranker.relative_to(directory)}",
        "    kind: rerank",
        "    description: Tiny BERT cross-encoder with seeded weights (scores are not meaningful)",
    ]


def _audio_entries() -> list[str]:
    """The factory's tiny random Whisper at /v1/audio/transcriptions and
    Soprano at /v1/audio/speech (docs/audio.md), their kinds written out;
    an install without mlx-audio (the audio extra) gets none. Built once per
    machine in the factory's cache (as the tests' are), not per demo folder."""
    if importlib.util.find_spec("mlx_audio") is None:
        return []
    whisper, soprano = build_whisper(), build_soprano()
    return [
        "  - name: whisper-tiny",
        f"    path: {whisper}",
        "    kind: transcription",
        "    aliases: [whisper-1]",
        "    description: Tiny Whisper-shaped speech-to-text model with seeded weights (its text is not meaningful)",
        "  - name: soprano-tiny",
        f"    path: {soprano}",
        "    kind: speech",
        "    aliases: [tts-1]",
        "    description: Tiny Soprano text-to-speech model with seeded weights (it makes sound, not speech)",
    ]


def write_demo(
    directory: Path, *, sizes: tuple[str, ...] = ("tiny", "small"), dtype: str | None = None
) -> Path:
    """Build the demo models into ``directory/models`` in ``dtype`` (None: this
    device's, see :func:`device_dtype`) and write ``directory/models.yaml``.
    Returns the registry file's path."""
    directory = directory.expanduser().resolve()
    dtype = dtype or device_dtype()
    models_dir = directory / "models"
    path, description = _smollm2(directory, models_dir, dtype)
    # Every name Claude Code and Codex ask for reaches the trained model.
    entries = [(DEFAULT_MODEL, path, ("default", '"claude-*"', '"gpt-*"'), description, '"64MB"')]
    for name, recipe, aliases, description in DEMO_MODELS:
        if recipe.size not in sizes:
            continue
        recipe = dataclasses.replace(recipe, dtype=dtype)
        if isinstance(recipe, VisionRecipe):
            # A text-only install (no mlx-vlm extra) gets a text-only demo.
            if importlib.util.find_spec("mlx_vlm") is None:
                continue
            path = build_vision_model(recipe, cache_dir=models_dir)
        else:
            path = build_model(recipe, cache_dir=models_dir)
        # Vision models keep no prefix cache: reserve no memory for one.
        prefix_cache = '"0"' if isinstance(recipe, VisionRecipe) else '"64MB"'
        entries.append((name, str(path.relative_to(directory)), aliases, description, prefix_cache))
    budget = "70%" if "bench" in sizes else "2GB"
    lines = [
        _HEADER,
        "# Every key is documented in models.yaml.example and docs/registry.md.",
        "server:",
        "  host: 127.0.0.1",
        "  port: 8080",
        "manager:",
        # A bench-size model alone is 1-2 GB: let it share the device's memory.
        f'  memory_budget: "{budget}"',
        "  default_idle_unload_seconds: 300",
        "  contention_policy:",
        "    strategy: wait_then_fail",
        "    wait_timeout_s: 30",
        "models:",
    ]
    for name, path, aliases, description, prefix_cache in entries:
        default = name == DEFAULT_MODEL
        lines += [
            f"  - name: {name}",
            f"    path: {path}",
            f"    description: {description}",
            f"    max_context: {_context(name)}",
            f"    max_concurrency: {2 if default else 4}",
            "    prefix_cache:",
            f"      max_bytes: {prefix_cache}",
        ]
        if aliases:
            lines.append(f"    aliases: [{', '.join(aliases)}]")
        if default:
            # A 135M model rambles at OpenAI's default temperature of 1;
            # greedy answers are its best (a request's own value still wins).
            lines += ["    defaults:", "      temperature: 0"]
    lines += _encoder_entries(directory, models_dir)
    lines += _audio_entries()
    target = directory / "models.yaml"
    directory.mkdir(parents=True, exist_ok=True)
    body = "\n".join(lines) + "\n"
    tmp = target.with_suffix(".yaml.tmp")
    tmp.write_text(body + _SIGNATURE.format(_checksum(body)) + "\n")
    tmp.replace(target)
    return target
