"""Fixtures for the embedding and rerank tests: the factory's tiny random
BERT encoders, all-MiniLM-L6-v2 from its PyPI wheel, and one daemon serving
them beside a tiny chat model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxd.factory.encoders import EncoderRecipe, build_encoder
from mlxd.factory.llm_reranker import build_llm_reranker
from mlxd.factory.minilm import minilm_dir
from support.daemon import Daemon, daemon_in_thread, write_registry

REFERENCE = Path(__file__).parent / "reference"
# An LLM reranker entry's own task (instead of the model card's web search).
CODE_INSTRUCTION = "Given a question about code, retrieve the snippet that answers it"


@pytest.fixture(scope="session")
def tiny_embedder() -> Path:
    return build_encoder(EncoderRecipe("embedding"))


@pytest.fixture(scope="session")
def tiny_reranker() -> Path:
    return build_encoder(EncoderRecipe("rerank"))


@pytest.fixture(scope="session")
def xlmr_reranker() -> Path:
    return build_encoder(EncoderRecipe("rerank", arch="xlm-roberta"))


@pytest.fixture(scope="session")
def llm_reranker() -> Path:
    return build_llm_reranker()


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_dir()


@pytest.fixture(scope="session")
def encoders_daemon(tmp_path_factory: pytest.TempPathFactory, tiny_embedder: Path, tiny_reranker: Path,
                    minilm: Path, llm_reranker: Path, xlmr_reranker: Path) -> Iterator[Daemon]:
    """``embed`` (tiny, Matryoshka), ``strict`` (tiny, truncate: false),
    ``minilm``, ``rerank`` (tiny), ``rerank-xlmr`` (a tiny XLM-R
    cross-encoder), ``rerank-llm`` (a tiny Qwen3-Reranker shape; also as
    ``rerank-llm-code``, under the instruction CODE_INSTRUCTION) and
    ``chat`` (a tiny text model)."""
    tmp = tmp_path_factory.mktemp("encoders")
    registry = write_registry(tmp, [
        {"name": "embed", "path": str(tiny_embedder), "kind": "embedding", "matryoshka": True},
        {"name": "strict", "path": str(tiny_embedder), "kind": "embedding", "truncate": False},
        {"name": "minilm", "path": str(minilm), "kind": "embedding", "aliases": ["all-minilm"]},
        {"name": "rerank", "path": str(tiny_reranker), "kind": "rerank"},
        {"name": "rerank-xlmr", "path": str(xlmr_reranker), "kind": "rerank"},
        {"name": "rerank-llm", "path": str(llm_reranker), "kind": "rerank"},
        {"name": "rerank-llm-code", "path": str(llm_reranker), "kind": "rerank", "instruction": CODE_INSTRUCTION},
        {"name": "chat", "model": "qwen"},
    ])
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon
