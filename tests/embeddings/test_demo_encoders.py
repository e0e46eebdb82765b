"""The demo registry serves all-MiniLM-L6-v2 as a `kind: embedding` entry and
a small cross-encoder as a `kind: rerank` entry, kinds written out."""

from __future__ import annotations

import yaml

from mlxd.cli.demo import _encoder_entries
from mlxd.registry.loader import load_registry


def test_the_demo_names_an_embedding_and_a_rerank_entry(tmp_path) -> None:
    lines = _encoder_entries(tmp_path, tmp_path / "models")
    entries = yaml.safe_load("\n".join(lines))
    assert {e["name"]: e["kind"] for e in entries} == {"minilm": "embedding", "rerank-tiny": "rerank"}
    registry_file = tmp_path / "models.yaml"
    registry_file.write_text("manager:\n  memory_budget: 2GB\nmodels:\n" + "\n".join(lines) + "\n")
    registry = load_registry(registry_file)
    minilm, rerank = registry.lookup("all-minilm"), registry.lookup("rerank-tiny")
    assert minilm is not None and minilm.kind == "embedding" and minilm.broken is None
    assert (minilm.path / "1_Pooling" / "config.json").is_file()
    assert rerank is not None and rerank.kind == "rerank" and rerank.broken is None
    # Their engines batch: many requests hold a lease at once.
    assert minilm.max_concurrency > 1 and minilm.footprint.weights > 80_000_000
