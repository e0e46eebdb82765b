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
from pathlib import Path

from mlxd.factory.cache_root import payload_key
from mlxd.factory.build import default_cache_dir
from mlxd.files import build_once
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.factory.zoo import FAMILIES, Family
from mlxd.factory.zoo_files import (
    CORPUS_BYTES,
    VOCAB_SIZE,
    resolve_config,
    seeded_weights,
    template_text,
    train_family_tokenizer,
    write_tokenizer_files,
)
from mlxd.factory.zoo_vision import write_vision_family

# Bump when the output of a build changes for the same row.
ZOO_VERSION = 1


def build_family(name: str, cache_dir: Path | None = None) -> Path:
    """The model folder of the zoo family ``name``, built on first use."""
    if name not in FAMILIES:
        raise ValueError(f"unknown zoo family {name!r}; choose from {', '.join(sorted(FAMILIES))}")
    return build_row(FAMILIES[name], cache_dir)


def build_row(family: Family, cache_dir: Path | None = None) -> Path:
    """The model folder of ``family`` (a zoo row, or a variant of one)."""
    name = family.name
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
    key = payload_key(payload)
    target = cache_dir / f"zoo-{name}-{key}"
    if family.vision:
        return build_once(target, lambda out: write_vision_family(family, files, out))
    return build_once(target, lambda out: _write_text_family(family, files, out))


def _write_text_family(family: Family, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    tok = train_family_tokenizer(family, files)
    write_tokenizer_files(family, tok, out)
    config = resolve_config(family.config, tok, family.eos)
    module = importlib.import_module(f"mlx_lm.models.{family.arch}")
    mx.random.seed(family.seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    seeded_weights(model, family)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "mlxd-zoo.json").write_text(json.dumps({"family": family.name, "zoo": ZOO_VERSION}, indent=2))
