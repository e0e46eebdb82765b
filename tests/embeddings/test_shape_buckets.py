"""Batches run at bucketed shapes on CUDA (engine/embedding_model.py,
``padded_shape``): the padding rows and tokens change no answer. The real
encoders run here on the CPU with bucketing forced on, which is the code path
a CUDA machine takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlxd.engine.embedding_batch import Batch, Row
from mlxd.engine.embedding_model import load_cross_encoder, load_embedder, padded_shape, to_numpy

TEXTS = ["a cat sits on the mat",
         "the daemon serves several models behind one API, and speech shares the machine with chat",
         "kitten"]


@pytest.mark.parametrize(("rows", "width", "max_length", "shape"), [
    (1, 5, 128, (1, 8)),
    (3, 9, 128, (4, 16)),
    (5, 8, 128, (8, 8)),
    (8, 17, 128, (8, 24)),
    (9, 17, 128, (16, 24)),
    (20, 126, 128, (24, 128)),
    # Never wider than the model reads (XLM-R: 510 positions of 512)...
    (2, 505, 510, (2, 510)),
    # ...and never narrower than the batch itself.
    (2, 127, 126, (2, 127)),
])
def test_a_batch_is_padded_to_its_bucket(rows: int, width: int, max_length: int, shape: tuple[int, int]) -> None:
    assert padded_shape(rows, width, max_length) == shape


def _batch(tokenized: list[list[int]], types: list[list[int]] | None = None) -> Batch:
    return Batch(tuple(Row(request=0, index=i, ids=tuple(ids), types=tuple(types[i]) if types else ())
                       for i, ids in enumerate(tokenized)))


def _both(encoder: object, batch: Batch, method: str) -> tuple[np.ndarray, np.ndarray]:
    results = []
    for bucketed in (False, True):
        encoder.bucketed = bucketed  # type: ignore[attr-defined]
        results.append(to_numpy(getattr(encoder, method)(batch)))
    return results[0], results[1]


@pytest.mark.parametrize("fixture", ["minilm", "tiny_embedder"])
def test_bucketed_vectors_equal_the_batch_at_its_own_shape(fixture: str, request: pytest.FixtureRequest) -> None:
    encoder, tokenizer = load_embedder(request.getfixturevalue(fixture))
    batch = _batch(tokenizer.texts(TEXTS).ids)
    assert padded_shape(len(batch.rows), batch.width, encoder.recipe.max_length) != (len(batch.rows), batch.width)
    own, bucketed = _both(encoder, batch, "embed")
    assert bucketed.shape == own.shape == (3, encoder.dimensions)
    assert np.all(np.isfinite(bucketed))
    np.testing.assert_allclose(bucketed, own, atol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_reranker", "xlmr_reranker"])
def test_bucketed_rerank_scores_equal_the_batch_at_its_own_shape(fixture: str, request: pytest.FixtureRequest) -> None:
    encoder, tokenizer = load_cross_encoder(request.getfixturevalue(fixture))
    encoded = tokenizer.pairs("where does the cat sit", TEXTS)
    batch = _batch(encoded.ids, encoded.types)
    own, bucketed = _both(encoder, batch, "score")
    assert bucketed.shape == own.shape == (3,)
    np.testing.assert_allclose(bucketed, own, atol=1e-5)


def test_only_a_cuda_machine_buckets(tiny_embedder: Path) -> None:
    import mlx.core as mx

    encoder, _ = load_embedder(tiny_embedder)
    assert encoder.bucketed is mx.cuda.is_available()
