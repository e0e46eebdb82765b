"""Deterministic, content-cached builds of small real models.

A model folder holds exactly what a downloaded Hugging Face MLX model holds
(``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``), so ``mlx_lm.load(path)`` takes the same path for
it as for a user's model.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from mlxd.factory.cache_root import default_cache_dir, payload_key
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.factory.tokenizer import IM_END, train_tokenizer, write_tokenizer
from mlxd.files import build_once

# Bump when the output of a build changes for the same recipe.
FACTORY_VERSION = 2

# At MLX's default initialisation a random model with tied embeddings echoes
# its input ("\n\n\n..."); scaling the matrices up makes greedy output varied
# text, which tests of stop strings, streaming and caching need.
WEIGHT_SCALE = 4.0


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    corpus_bytes: int


SIZES: dict[str, Shape] = {
    # Seconds to build, milliseconds to load: for tests. 32k positions: an
    # agent's prompt (Codex's ~11k tokens with this vocabulary) fits the demo's
    # tiny models without a window beyond what their config says.
    "tiny": Shape(128, 2, 256, 4, 2, 2048, 32768, 1_500_000),
    # A few hundred MB of activity, still quick: for demos.
    "small": Shape(512, 4, 1408, 8, 2, 8192, 8192, 3_000_000),
    # Qwen2.5-0.5B's layer shapes (vocabulary trimmed to what we train): for benchmarks.
    "bench": Shape(896, 24, 4864, 14, 2, 32768, 32768, 6_000_000),
    # Qwen2.5-7B's layer shapes: a chat model of the size people pin, whose
    # decode step on a GPU is bound by its weights' reads rather than by the
    # host's Python, for benchmarks that ask what other work costs it (GPU only:
    # 15 GB in bfloat16).
    "large": Shape(3584, 28, 18944, 28, 4, 32768, 32768, 6_000_000),
}

ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelRecipe:
    arch: str = "qwen2"
    size: str = "tiny"
    dtype: str = "float32"
    quant_bits: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {self.arch!r}; choose from {ARCHITECTURES}")
        if self.size not in SIZES:
            raise ValueError(f"unknown size {self.size!r}; choose from {sorted(SIZES)}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if self.quant_bits not in (None, 2, 3, 4, 6, 8):
            raise ValueError(f"unsupported quantisation bits {self.quant_bits!r}")

    @property
    def shape(self) -> Shape:
        return SIZES[self.size]

    def slug(self) -> str:
        q = f"-q{self.quant_bits}" if self.quant_bits else ""
        return f"{self.arch}-{self.size}-{self.dtype}{q}-s{self.seed}"




def build_model(recipe: ModelRecipe, cache_dir: Path | None = None) -> Path:
    """Return the folder of the model ``recipe`` describes, building it once.

    Concurrent callers (pytest workers, a daemon and a benchmark) are serialised
    by a lock file; a build is written to a temporary folder and renamed, so a
    crash never leaves a half-written model behind.
    """
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    files = stdlib_files(recipe.shape.corpus_bytes)
    key = _content_key(recipe, corpus_digest(files))
    target = cache_dir / f"{recipe.slug()}-{key}"
    return build_once(target, lambda out: _write_model(recipe, files, out))


def _content_key(recipe: ModelRecipe, digest: str) -> str:
    payload = {
        "recipe": dataclasses.asdict(recipe),
        "shape": dataclasses.asdict(recipe.shape),
        "corpus": digest,
        "python": list(sys.version_info[:2]),
        "factory": FACTORY_VERSION,
    }
    return payload_key(payload)


def _write_model(recipe: ModelRecipe, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.utils import _get_classes, quantize_model

    shape = recipe.shape
    tok = train_tokenizer(files, shape.vocab_size)
    write_tokenizer(tok, out, shape.max_position_embeddings)

    config = {
        "model_type": recipe.arch,
        "architectures": ["Qwen2ForCausalLM" if recipe.arch == "qwen2" else "LlamaForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        # The trained vocabulary can come out a little short of the target.
        "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "eos_token_id": tok.token_to_id(IM_END),
        "torch_dtype": recipe.dtype,
    }
    model_class, args_class = _get_classes(config)
    mx.random.seed(recipe.seed)
    model = model_class(args_class.from_dict(config))
    dtype = getattr(mx, recipe.dtype)
    model.update(
        tree_map(
            lambda p: (p * WEIGHT_SCALE if p.ndim == 2 else p).astype(dtype),
            model.parameters(),
        )
    )
    if recipe.quant_bits:
        model, config = quantize_model(model, config, group_size=64, bits=recipe.quant_bits)
        config["quantization_config"] = config["quantization"]
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))
