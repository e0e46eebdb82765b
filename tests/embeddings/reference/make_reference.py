"""Computes the reference outputs the embedding tests compare mlxd against,
with sentence-transformers itself (and PyTorch, on the CPU). Run once, in a
virtual environment of its own, outside the project's:

    python3 -m venv /tmp/st-venv
    /tmp/st-venv/bin/pip install torch==2.13.0 sentence-transformers   # 2.13.0: a CPU build
    /tmp/st-venv/bin/python tests/embeddings/reference/make_reference.py MINILM_DIR RERANK_DIR

MINILM_DIR is all-MiniLM-L6-v2's folder (``python -m mlxd.factory.minilm``
prints it); RERANK_DIR the factory's tiny cross-encoder
(``build_encoder(EncoderRecipe("rerank"))``). Writes, beside this file,
``minilm_vectors.npy`` (100 x 384 float32) and ``rerank_scores.json``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import sentence_transformers
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from texts import RERANK_DOCUMENTS, RERANK_QUERY, TEXTS  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(minilm: Path, rerank: Path) -> None:
    model = SentenceTransformer(str(minilm), device="cpu")
    vectors = model.encode(TEXTS, batch_size=16, convert_to_numpy=True, normalize_embeddings=False)
    np.save(HERE / "minilm_vectors.npy", vectors.astype("<f4"))
    encoder = CrossEncoder(str(rerank), device="cpu")
    scores = encoder.predict([(RERANK_QUERY, d) for d in RERANK_DOCUMENTS])
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    (HERE / "rerank_scores.json").write_text(json.dumps({
        "made_with": {"sentence_transformers": sentence_transformers.__version__, "torch": torch.__version__},
        "rerank_model_sha256": sha256(rerank / "model.safetensors"),
        "scores": [float(s) for s in scores],
        "order": order,
    }, indent=2) + "\n")
    print(f"{vectors.shape[0]} vectors of {vectors.shape[1]}; rerank order {order}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
