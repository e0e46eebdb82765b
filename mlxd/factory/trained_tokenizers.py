"""Trained tokenizers, kept by what they were trained on.

Training a 1k-4k vocabulary takes two to three seconds, and every tiny model
trains one. Models built into different folders (a demo's own, a test's
temporary home) from the same corpus and settings get the same tokenizer, so
it is trained once per machine and read back (a tokenizer.json is lossless).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxd.factory.cache_root import default_cache_dir, payload_key
from mlxd.factory.corpus import corpus_digest
from mlxd.files import build_once


def trained_once(kind: str, files: list[Path], settings: dict[str, Any], train: Callable[[], Any]) -> Any:
    """The tokenizer ``train()`` makes from ``files``; ``kind`` and ``settings``
    must name everything else that shapes it (trainer, vocabulary, special tokens)."""
    import tokenizers

    payload = {"kind": kind, "corpus": corpus_digest(files), "settings": settings,
               "tokenizers": tokenizers.__version__}
    key = payload_key(payload, 16)

    def write(out: Path) -> None:
        train().save(str(out / "tokenizer.json"))
        # build_once's completeness marker, and what the key stands for.
        (out / "config.json").write_text(json.dumps(payload, indent=2, sort_keys=True))

    folder = build_once(default_cache_dir() / "tokenizers" / f"{kind}-{key}", write)
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
