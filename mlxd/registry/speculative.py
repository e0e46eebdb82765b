"""``speculative:`` on a model entry, checked and resolved (docs/speculative.md).

What one entry can tell alone (the method needs a text model; ``draft`` needs
a ``draft_model`` and the others take none; ``mtp`` needs heads that mlx-lm
loads) is checked by ``entry_spec``; what spans entries (the draft model
exists, is a local text model and has the same tokenizer) by ``resolve_drafts``
once every entry is built, which also charges the draft's memory to the
target: the engine loads and unloads the two together.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError
from mlxd.registry.document import Document, Loc
from mlxd.registry.kinds import a_model_of
from mlxd.registry.model import ModelSpec, SpeculativeSpec
from mlxd.registry.schema import ModelEntry

# Files that make up a tokenizer: two models share one when these agree.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "tiktoken.model")


def entry_spec(doc: Document, i: int, entry: ModelEntry, kind: str, config: Mapping[str, Any]) -> SpeculativeSpec | None:
    section = entry.speculative
    if section is None:
        return None
    here: Loc = ("models", i, "speculative")
    if kind != "text":
        raise doc.error(here, f"speculative decoding is for text models; `{entry.name}` is {a_model_of(kind)}")
    if section.method == "draft" and section.draft_model is None:
        raise doc.error((*here, "draft_model"), "`method: draft` needs `draft_model:`, the registry model that drafts")
    if section.method != "draft" and section.draft_model is not None:
        raise doc.error((*here, "draft_model"), f"`draft_model` is for `method: draft`; `{section.method}` drafts "
                        "without another model")
    if section.method == "mtp":
        raise doc.error((*here, "method"), _no_mtp(entry.name, config))
    if entry.kv_bits is not None:
        # Accepted, the engine would decode without speculation (and load the
        # draft for nothing) while `mlxd check` said it speculates.
        raise doc.error(here, "speculative decoding runs in the continuous batch, which does not take a "
                        "quantised KV cache; drop `kv_bits` or `speculative`")
    return SpeculativeSpec(method=section.method, tokens=section.tokens, draft_model=section.draft_model,
                           auto_off=section.auto_off)


def _no_mtp(name: str, config: Mapping[str, Any]) -> str:
    try:
        version = metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    model_type = config.get("model_type") or "unknown"
    return (
        f"`{name}` (model_type `{model_type}`) has no multi-token-prediction heads mlx-lm can run: mlx-lm "
        f"{version} drops the `mtp.*` weights of every family it loads (each model's `sanitize`), so "
        "`method: mtp` cannot draft; use `method: prompt_lookup` or `method: draft`"
    )


def resolve_drafts(
    doc: Document,
    models: Sequence[ModelSpec],
    index: Mapping[str, int],
    draft_bytes: Callable[[ModelSpec, ModelSpec], int],
    check_fits: Callable[[Loc, ModelSpec], None],
) -> list[ModelSpec]:
    """Every ``method: draft`` entry with its draft's folder and memory.

    ``index``: an entry's name -> its place under ``models:`` (for errors);
    ``draft_bytes(target, draft)``: the draft's weights and KV cache."""
    by_name = {name: spec for spec in models for name in spec.names()}
    out = []
    for spec in models:
        s = spec.speculative
        if s is None or s.method != "draft" or spec.broken:
            out.append(spec)
            continue
        loc: Loc = ("models", index[spec.name], "speculative", "draft_model")
        draft = by_name.get(s.draft_model or "")
        if draft is None:
            raise doc.error(loc, f"no model is named `{s.draft_model}`; `draft_model` names a registry entry")
        if draft.name == spec.name:
            raise doc.error(loc, f"`{spec.name}` cannot draft for itself; name a smaller model of its tokenizer")
        if draft.is_remote or draft.kind != "text":
            raise doc.error(loc, f"the draft model `{draft.name}` must be a local text model")
        if draft.broken:
            raise doc.error(loc, f"the draft model `{draft.name}` cannot be loaded: {draft.broken}")
        if not same_tokenizer(spec.path, draft.path):
            raise doc.error(loc, f"the draft model `{draft.name}` has another tokenizer than `{spec.name}`; "
                            "a draft must share its target's token ids")
        ratio = draft.footprint.weights / spec.footprint.weights if spec.footprint.weights > 0 else None
        resolved_s = dataclasses.replace(s, draft_model=draft.name, draft_path=draft.path, draft_ratio=ratio)
        resolved = dataclasses.replace(
            spec,
            speculative=resolved_s,
            # A draft that cannot pay is never loaded, so it holds no memory.
            footprint=dataclasses.replace(spec.footprint,
                                          draft=0 if resolved_s.cannot_pay else draft_bytes(spec, draft)),
        )
        check_fits(("models", index[spec.name]), resolved)
        out.append(resolved)
    return out


def tokenizer_digest(folder: Path) -> str | None:
    """A digest of the folder's tokenizer files (None: it has none)."""
    digest = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            found = True
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest() if found else None


def same_tokenizer(a: Path, b: Path) -> bool:
    try:
        first, second = tokenizer_digest(a), tokenizer_digest(b)
    except OSError as exc:
        raise ConfigError(f"cannot read the tokenizer files: {exc}") from None
    return first is not None and first == second
