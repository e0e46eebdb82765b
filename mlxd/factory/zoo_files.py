"""The parts every zoo model folder is made of, text or vision: the
family's tokenizer (trained, with its special tokens), its tokenizer_config
with the real chat template, the config with its placeholders filled in,
and the seeded weights."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from mlxd.factory.trained_tokenizers import trained_once
from mlxd.factory.zoo import EOS, TOKEN_ID, VOCAB, Family

# Enough text for a varied 1k vocabulary; a few seconds to train.
CORPUS_BYTES = 400_000
VOCAB_SIZE = 1024


def template_text(family: Family) -> str:
    return resources.files("mlxd.factory").joinpath("templates", family.template).read_text(encoding="utf-8")


def train_family_tokenizer(family: Family, files: list[Path]) -> Any:
    """A byte-level BPE over ``files`` holding the family's special tokens as single ids."""
    settings = {"vocab_size": VOCAB_SIZE, "control": list(family.control), "markup": list(family.markup)}
    return trained_once("family-bpe", files, settings, lambda: _train(family, files))


def _train(family: Family, files: list[Path]) -> Any:
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


def resolve_config(config: Any, tok: Any, eos: tuple[str, ...] = ()) -> Any:
    """``config`` with the placeholders filled in from the trained tokenizer:
    VOCAB (its size), EOS (the ids of ``eos``), ``token_id(t)`` (the id of t)."""
    if isinstance(config, dict):
        return {k: resolve_config(v, tok, eos) for k, v in config.items()}
    if isinstance(config, list):
        return [resolve_config(v, tok, eos) for v in config]
    if config == VOCAB:
        return tok.get_vocab_size()
    if config == EOS:
        return [tok.token_to_id(t) for t in eos]
    if isinstance(config, str) and config.startswith(TOKEN_ID):
        return tok.token_to_id(config[len(TOKEN_ID):])
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
        **family.tokenizer_extra,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    special = {k: v for k, v in (("bos_token", family.bos), ("eos_token", family.eos[0]), ("pad_token", family.pad)) if v}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False))


def seeded_weights(model: Any, family: Family) -> None:
    """Draw the constant-initialised parameters the row names, then scale
    the seeded matrices, as the text factory does, so greedy output is varied text."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map, tree_unflatten

    params = dict(tree_flatten(model.parameters()))
    drawn = {k: mx.random.normal(params[k].shape) / params[k].shape[0] ** 0.5 for k in family.randomize}
    model.update(tree_unflatten(list(drawn.items())))
    model.update(tree_map(lambda p: p * family.weight_scale if p.ndim == 2 else p, model.parameters()))
    mx.eval(model.parameters())
