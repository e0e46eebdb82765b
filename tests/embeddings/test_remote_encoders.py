"""An embedding or rerank entry served by a backend (here another mlxd) is
relayed: the same vectors and ranking as asking the backend itself."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx


def test_embedding_and_rerank_entries_on_a_backend(tmp_path, encoders_daemon) -> None:
    registry = write_registry(tmp_path, [
        {"name": "far-embed", "backend": "up", "remote_model": "minilm", "kind": "embedding"},
        {"name": "far-rerank", "backend": "up", "remote_model": "rerank", "kind": "rerank"},
    ], backends={"up": {"url": encoders_daemon.url + "/v1", "kind": "mlxd"}})
    texts = ["a cat sits on the mat", "stock markets fell sharply"]
    with daemon_in_thread(registry, tmp_path) as front:
        relayed = httpx.post(front.url + "/v1/embeddings", json={"model": "far-embed", "input": texts},
                             timeout=60)
        assert relayed.status_code == 200, relayed.text
        direct = httpx.post(encoders_daemon.url + "/v1/embeddings", json={"model": "minilm", "input": texts},
                            timeout=60).json()
        assert relayed.json()["model"] == "far-embed"
        np.testing.assert_array_equal([d["embedding"] for d in relayed.json()["data"]],
                                      [d["embedding"] for d in direct["data"]])
        assert relayed.json()["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        # The backend's own refusal comes back as a 400.
        refused = httpx.post(front.url + "/v1/embeddings", json={"model": "far-embed", "input": "x",
                                                                 "dimensions": 5}, timeout=60)
        assert refused.status_code == 400 and "matryoshka" in refused.json()["error"]["message"]
        body = {"query": "what is python", "documents": ["python is a language", "bananas", "snakes"]}
        ranked = httpx.post(front.url + "/v1/rerank", json={"model": "far-rerank", **body}, timeout=60).json()
        here = httpx.post(encoders_daemon.url + "/v1/rerank", json={"model": "rerank", **body}, timeout=60).json()
        assert [r["index"] for r in ranked["results"]] == [r["index"] for r in here["results"]]
        assert ranked["results"][0]["document"]["text"] == body["documents"][here["results"][0]["index"]]
