"""What the third-party client tests share (imported as ``clients.clients_support``).

Each client runs in its own venv under ``.agents/venvs/`` (scripts/setup.sh
--tests installs them, pinned; they pin shared packages differently from
mlxd and from each other), driven by a script in ``drivers/`` written as the
client's own documentation shows, which prints what it got as JSON. One
daemon for all of them serves the demo registry as `mlxd demo` writes it:
``default`` (SmolLM2) for plain answers, a trained model that ends them;
``qwen-tiny`` for tool calls and structured output, forced by the grammar;
``minilm`` (all-MiniLM-L6-v2, trained), ``rerank-tiny``, ``whisper-1`` and
``tts-1`` for the other kinds, whose answers the tests set against what
mlxd's own routes answer for the same input (``minilm_vectors``, ``post``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = Path(__file__).resolve().parent / "drivers"


def client_python(venv: str) -> Path:
    python = ROOT / ".agents" / "venvs" / venv / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"the `{venv}` client is not installed: run scripts/setup.sh --tests")
    return python


def drive(venv: str, driver: str, url: str, timeout: float = 800, **env: str) -> dict:
    """Run ``drivers/<driver>`` with the client's python against ``url``; its JSON."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}
    run = subprocess.run(
        [str(client_python(venv)), str(DRIVERS / driver)], env={**clean, "MLXD_URL": url, **env},
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def post(url: str, path: str, body: dict) -> httpx.Response:
    answer = httpx.post(url + path, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer


def minilm_vectors(demo, texts: list[str]) -> np.ndarray:
    """What /v1/embeddings answers for ``texts``, as float32 (JSON's shortest
    forms read back as the same float32s a client's base64 decodes to)."""
    data = post(demo.url, "/v1/embeddings", {"model": "minilm", "input": texts}).json()["data"]
    return np.array([d["embedding"] for d in data], dtype=np.float32)


# Two documents and a query that a trained model orders: the kitten is nearer the cat.
DOCUMENTS = ["a cat sits on the mat", "stock markets fell sharply"]
QUERY = "a kitten rests on a rug"


def assert_minilm_vectors(demo, documents: list[list[float]], query: list[float]) -> None:
    """A client's vectors for DOCUMENTS and QUERY are the unit vectors that
    /v1/embeddings gives for them, MiniLM's 384, in the order a user expects."""
    docs, asked = np.array(documents), np.array(query)
    assert docs.shape == (2, 384) and asked.shape == (384,)
    assert np.linalg.norm(docs, axis=1) == pytest.approx([1, 1], abs=1e-5)
    np.testing.assert_allclose(docs, minilm_vectors(demo, DOCUMENTS), rtol=0, atol=1e-6)
    np.testing.assert_allclose(asked, minilm_vectors(demo, [QUERY])[0], rtol=0, atol=1e-6)
    assert asked @ docs[0] > asked @ docs[1] + 0.3
