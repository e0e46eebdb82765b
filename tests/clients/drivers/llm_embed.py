"""The `llm` CLI's embeddings against mlxd. llm has no configuration file
for OpenAI-compatible embedding models (extra-openai-models.yaml holds chat
models): its OpenAI embedding models go wherever the openai client's
OPENAI_BASE_URL points, under OpenAI's names, so mlxd serves ``minilm`` as
``text-embedding-3-small`` too (the demo's alias; llm's ``3-small``). One
text with ``llm embed -c``; then a collection stored with ``llm embed`` and
searched with ``llm similar``. DOCUMENTS (JSON: id to text) and QUERY."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LLM = str(Path(sys.executable).parent / "llm")
env = {**os.environ, "LLM_USER_PATH": tempfile.mkdtemp(), "OPENAI_BASE_URL": os.environ["MLXD_URL"] + "/v1",
       "OPENAI_API_KEY": "unused"}


def llm(*args: str) -> str:
    run = subprocess.run([LLM, *args], env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        sys.exit(f"llm {' '.join(args)} exited {run.returncode}:\n{run.stdout}\n{run.stderr}")
    return run.stdout


query = os.environ["QUERY"]
out = {"vector": json.loads(llm("embed", "-m", "3-small", "-c", query))}
for doc_id, text in json.loads(os.environ["DOCUMENTS"]).items():
    llm("embed", "phrases", doc_id, "-m", "3-small", "-c", text)
out["similar"] = [json.loads(line) for line in llm("similar", "phrases", "-c", query).splitlines()]
print(json.dumps(out))
