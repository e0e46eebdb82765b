"""Tiny thinking models for the reasoning tests (imported as ``thinking.thinking_models``).

A qwen3 model from mlx-lm's own class (``mlx_lm.models.qwen3``, random
weights) over the factory's tokenizer with Qwen3's added tokens
(``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>``, not special,
as Qwen3 ships them), so mlx-lm's detection finds the think markers and the
``json_tools`` tool parser. Templates are model data:

- ``qwen3``: Qwen3's own (Qwen/Qwen3-0.6B ``tokenizer_config.json``, as
  llama.cpp keeps it in ``models/templates/Qwen-Qwen3-0.6B.jinja``): the
  model opens its own think block, and ``enable_thinking: false`` renders
  the empty ``<think>\\n\\n</think>\\n\\n`` after the generation prompt.
- ``qwen3-thinking``: the same with the generation prompt of the
  Qwen3-*-Thinking-2507 checkpoints, which open the block themselves
  (``<|im_start|>assistant\\n<think>\\n``): a random model then reasons
  until its budget ends it.

A harmony (gpt-oss) vocabulary for the offline harmony tests is
``harmony_tokenizer``: the factory's tokenizer with gpt-oss's special tokens.

Swapped for the zoo's qwen3 once ``mlxd/factory`` has its family table.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from support.daemon import tiny_model

from mlxd.factory.build import WEIGHT_SCALE, build_once, default_cache_dir

TEMPLATES = Path(__file__).parent / "templates"
THINK_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
QWEN3_GENERATION = "{{- '<|im_start|>assistant\\n' }}\n"
THINKING_GENERATION = "{{- '<|im_start|>assistant\\n<think>\\n' }}\n"


def template(name: str) -> str:
    text = (TEMPLATES / "qwen3.jinja").read_text()
    if name == "qwen3":
        return text
    if name == "qwen3-thinking":
        assert QWEN3_GENERATION in text
        return text.replace(QWEN3_GENERATION, THINKING_GENERATION)
    raise ValueError(name)


def thinking_model(name: str = "qwen3") -> Path:
    """The tiny qwen3 model with template ``name``, built once per content."""
    base = tiny_model("qwen")
    chat = template(name)
    key = hashlib.sha256(json.dumps([str(base), chat, THINK_TOKENS, 1]).encode()).hexdigest()[:12]
    return build_once(default_cache_dir() / f"thinking-{name}-{key}", lambda out: _write(base, chat, out))


def harmony_tokenizer(out: Path) -> Path:
    """A tokenizer folder whose vocabulary has gpt-oss's harmony tokens."""
    if not (out / "tokenizer.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        _tokenizer(tiny_model("qwen"), out, HARMONY_TOKENS, special=True)
        shutil.copy(tiny_model("qwen") / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def _tokenizer(base: Path, out: Path, added: list[str], *, special: bool) -> int:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t in added])
    tok.save(str(out / "tokenizer.json"))
    return tok.get_vocab_size()


def _write(base: Path, chat: str, out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.models import qwen3

    vocab_size = _tokenizer(base, out, THINK_TOKENS, special=False)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = chat
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(base / "special_tokens_map.json", out / "special_tokens_map.json")
    base_config = json.loads((base / "config.json").read_text())
    model_config = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "eos_token_id": base_config["eos_token_id"],
        "torch_dtype": "float32",
    }
    mx.random.seed(3)
    model = qwen3.Model(qwen3.ModelArgs.from_dict(model_config))
    model.update(tree_map(lambda p: p * WEIGHT_SCALE if p.ndim == 2 else p, model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(model_config, indent=2, sort_keys=True))
