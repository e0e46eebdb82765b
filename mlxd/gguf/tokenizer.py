"""tokenizer.json and tokenizer_config.json rebuilt from a GGUF's vocabulary.

GGUF keeps the tokenizer as lists (tokens, merges or scores, token types)
plus the name of llama.cpp's pre-tokenizer; ``tokenizers`` turns them back
into the byte-level BPE or SentencePiece BPE tokenizer the model was trained
with.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
)

from mlxd.errors import GGUFError

log = logging.getLogger(__name__)

_CONTROL = 3  # llama.cpp's token type for special tokens (<|im_end|>, ...)
_USER_DEFINED = 4

# llama.cpp's pre-tokenizer names (``tokenizer.ggml.pre``) and the splits
# Hugging Face's tokenizer.json gives the same models.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer(name: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if name in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if name in ("llama-bpe", "llama3", "smaug-bpe"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, raw_bytes])
    if name in ("qwen2", "deepseek-r1-qwen"):
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, raw_bytes])
    if name not in (None, "default", "gpt2", "gpt-2"):
        log.warning("GGUF pre-tokenizer `%s` is not known to mlxd; using GPT-2's", name)
    return byte_level


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer: Tokenizer
    config: dict[str, Any]
    eos_token_ids: list[int]
    bos_token_id: int | None


def _byte_level_bpe(metadata: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    pre = metadata.get("tokenizer.ggml.pre")
    vocab = {token: i for i, token in enumerate(tokens)}
    for merge in merges:
        # The Rust tokenizer panics on such a merge (a BaseException that
        # would pass every ``except Exception``).
        if len(merge) != 2 or "".join(merge) not in vocab or merge[0] not in vocab or merge[1] not in vocab:
            raise GGUFError(f"GGUF merge `{' '.join(merge)}` names a token the vocabulary lacks")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama-bpe", "llama3")))
    if pre in ("qwen2", "deepseek-r1-qwen"):
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(metadata: Mapping[str, Any], tokens: list[str]) -> Tokenizer:
    """SentencePiece BPE (Llama 2, Mistral) as Hugging Face's converter
    rebuilds it: merges recovered from the piece scores, byte fallback for
    characters outside the vocabulary, ``▁`` for spaces."""
    scores = list(metadata.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))])
    vocab = {token: i for i, token in enumerate(tokens)}
    ranked = []
    for piece, score in zip(tokens, scores):
        splits = [(piece[:i], piece[i:]) for i in range(1, len(piece))]
        local = sorted((s for s in splits if s[0] in vocab and s[1] in vocab), key=lambda s: (vocab[s[0]], vocab[s[1]]))
        ranked += [(score, left, right) for left, right in local]
    ranked.sort(key=lambda item: -item[0])  # stable: ties keep the order above
    unknown = metadata.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(models.BPE(
        vocab=vocab, merges=[(left, right) for _, left, right in ranked],
        unk_token=tokens[int(unknown)] if unknown is not None else None, fuse_unk=True, byte_fallback=True,
    ))
    steps = [normalizers.Replace(" ", "\u2581")]
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if metadata.get("tokenizer.ggml.add_space_prefix", True) else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tok


_BUILDERS = {"gpt2": (_byte_level_bpe, False), "llama": (_sentencepiece_bpe, True)}


def build_tokenizer(metadata: Mapping[str, Any]) -> TokenizerFiles:
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in _BUILDERS:
        raise GGUFError(
            f"GGUF tokenizer model `{kind}` is not supported; mlxd rebuilds byte-level BPE "
            "(`gpt2`: Llama 3, Qwen2, SmolLM) and SentencePiece BPE (`llama`: Llama 2, Mistral)"
        )
    if "tokenizer.ggml.tokens" not in metadata:
        raise GGUFError("the GGUF file has no tokenizer.ggml.tokens (its vocabulary)")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types = list(metadata.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    build, adds_bos = _BUILDERS[kind]
    tok = build(metadata, tokens)
    specials = [
        AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in specials if a.special])
    tok.add_tokens([a for a in specials if not a.special])

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None

    eos_ids = []
    for key in ("eos", "eot", "eom"):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if index is not None and int(index) not in eos_ids:
            eos_ids.append(int(index))
    if not eos_ids:
        raise GGUFError("GGUF metadata names no end-of-sequence token (tokenizer.ggml.eos_token_id)")
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", adds_bos))
    if add_bos and token("bos") is not None:
        # tokenizer.json, not tokenizer_config.json, is what adds it for a fast tokenizer.
        first = token("bos")
        tok.post_processor = processors.TemplateProcessing(
            single=f"{first} $A", pair=f"{first} $A {first} $B", special_tokens=[(first, int(bos))]
        )
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": add_bos,
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(metadata.get(f"{metadata['general.architecture']}.context_length", 4096)),
    }
    template = metadata.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return TokenizerFiles(tok, config, eos_ids, None if bos is None else int(bos))


def write_tokenizer(files: TokenizerFiles, folder: Path) -> None:
    files.tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(files.config, indent=2))
