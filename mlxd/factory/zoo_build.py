"""Builds a zoo family (``mlxd.factory.zoo``) into a model folder, once per content hash.

The folder holds what the family's Hugging Face checkpoint holds: its
``config.json``, seeded weights from mlx-lm's own class for the architecture,
a ``tokenizer.json`` trained on the standard library with the family's
special tokens added, a ``tokenizer_config.json`` carrying its real chat
template, bos/eos/pad tokens. ``mlx_lm.load`` takes the same path for it as
for the real model, so its detection of tool parsers and think markers runs
on the family's own template and vocabulary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from mlxd.factory.build import build_once, default_cache_dir
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.factory.zoo import EOS, FAMILIES, VOCAB, Family

# Bump when the output of a build changes for the same row.
ZOO_VERSION = 1

# Enough text for a varied 1k vocabulary; a few seconds to train.
CORPUS_BYTES = 400_000
VOCAB_SIZE = 1024


def template_text(family: Family) -> str:
    return resources.files("mlxd.factory").joinpath("templates", family.template).read_text(encoding="utf-8")


def build_family(name: str, cache_dir: Path | None = None) -> Path:
    """The model folder of the zoo family ``name``, built on first use."""
    if name not in FAMILIES:
        raise ValueError(f"unknown zoo family {name!r}; choose from {', '.join(sorted(FAMILIES))}")
    family = FAMILIES[name]
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    files = stdlib_files(CORPUS_BYTES)
    payload = {
        "family": dataclasses.asdict(family),
        "template": hashlib.sha256(template_text(family).encode()).hexdigest(),
        "corpus": corpus_digest(files),
        "vocab": VOCAB_SIZE,
        "python": list(sys.version_info[:2]),
        "zoo": ZOO_VERSION,
    }
    key = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_dir / f"zoo-{name}-{key}"
    return build_once(target, lambda out: _write_text_family(family, files, out))


def train_family_tokenizer(family: Family, files: list[Path]) -> Any:
    """A byte-level BPE over ``files`` holding the family's special tokens as single ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(family.control),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family.markup])
    return tok


def resolve_config(config: Any, vocab_size: int, eos_ids: list[int]) -> Any:
    """``config`` with the VOCAB and EOS placeholders filled in."""
    if isinstance(config, dict):
        return {k: resolve_config(v, vocab_size, eos_ids) for k, v in config.items()}
    if isinstance(config, list):
        return [resolve_config(v, vocab_size, eos_ids) for v in config]
    if config == VOCAB:
        return vocab_size
    if config == EOS:
        return eos_ids
    return config


def write_tokenizer_files(family: Family, tok: Any, out: Path) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": family.bos,
        "eos_token": family.eos[0],
        "pad_token": family.pad,
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": template_text(family),
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special = {k: v for k, v in (("bos_token", family.bos), ("eos_token", family.eos[0]), ("pad_token", family.pad)) if v}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False))


def seeded_weights(model: Any, scale: float) -> None:
    """Scale the seeded matrices, as the text factory does, so greedy output is varied text."""
    import mlx.core as mx
    from mlx.utils import tree_map

    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())


def _write_text_family(family: Family, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tok = train_family_tokenizer(family, files)
    write_tokenizer_files(family, tok, out)
    eos_ids = [tok.token_to_id(t) for t in family.eos]
    config = resolve_config(family.config, tok.get_vocab_size(), eos_ids)
    module = importlib.import_module(f"mlx_lm.models.{family.arch}")
    mx.random.seed(family.seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    seeded_weights(model, family.weight_scale)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "mlxd-zoo.json").write_text(json.dumps({"family": family.name, "zoo": ZOO_VERSION}, indent=2))
