"""The `llm` CLI: models from extra-openai-models.yaml, a streamed answer
(the same as the whole one), --schema output valid against its schema, and
a `--functions` tool that llm parses out of mlxd's call and runs (the
forcing proxy makes the random model call it: llm cannot force a call).
`llm embed` and `llm similar` with MiniLM under OpenAI's model name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from clients.clients_support import DOCUMENTS, QUERY, drive, minilm_vectors
from clients.forcing_proxy import MARKER, ForcingProxy, assert_client_ran_the_call

# Plain answers come from SmolLM2: seconds on an idle CPU, minutes on a loaded one.
pytestmark = [pytest.mark.mlx, pytest.mark.slow, pytest.mark.timeout(900)]


def test_llm_cli_runs_against_the_demo(demo, workdir):
    note = str(workdir / "note.txt")
    with ForcingProxy(demo.url, "read_note", note) as proxy:
        got = drive("llm", "llm_cli.py", proxy.url, NOTE=note)
    assert_client_ran_the_call(proxy, MARKER)
    assert got["streamed"].strip() and got["streamed"] == got["whole"]
    assert set(got["schema"]) == {"ok", "level"}, got
    assert got["schema"]["level"] in ("low", "high") and isinstance(got["schema"]["ok"], bool)


PHRASES = dict(zip(("cat", "stocks"), DOCUMENTS))


def test_llm_embeds_with_minilm_under_openais_name(demo):
    got = drive("llm", "llm_embed.py", demo.url, timeout=300, DOCUMENTS=json.dumps(PHRASES), QUERY=QUERY)
    assert len(got["vector"]) == 384
    np.testing.assert_allclose(got["vector"], minilm_vectors(demo, [QUERY])[0], rtol=0, atol=1e-6)
    # `llm similar` over a stored collection: the kitten is nearer the cat (MiniLM is trained).
    assert [hit["id"] for hit in got["similar"]] == ["cat", "stocks"]
    assert got["similar"][0]["score"] > got["similar"][1]["score"] + 0.3
