"""Simon Willison's `llm` CLI against mlxd, set up as its docs add an
OpenAI-compatible server: models in extra-openai-models.yaml (in the user
directory LLM_USER_PATH names), then `llm -m ID PROMPT` (streamed by default),
`--schema` (a json_schema response_format) and `--functions` (a Python
function as a tool, which llm runs when the model calls it). With NOTE set,
a tool-using turn reads that file through the function."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

URL = os.environ["MLXD_URL"] + "/v1"
LLM = str(Path(sys.executable).parent / "llm")
STATUS = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
          "required": ["ok", "level"], "additionalProperties": False}

home = tempfile.mkdtemp()
Path(home, "extra-openai-models.yaml").write_text(
    f"- model_id: mlxd-default\n  model_name: default\n  api_base: {URL}\n"
    f"- model_id: mlxd-tiny\n  model_name: qwen-tiny\n  api_base: {URL}\n  supports_schema: true\n"
    f"  supports_tools: true\n")
READ_NOTE = "def read_note(path: str) -> str:\n    'The text of the file at path.'\n    return open(path).read()\n"
env = {**os.environ, "LLM_USER_PATH": home}


def llm(*args: str) -> str:
    run = subprocess.run([LLM, *args], env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        sys.exit(f"llm {' '.join(args)} exited {run.returncode}:\n{run.stdout}\n{run.stderr}")
    return run.stdout


out = {
    "streamed": llm("-m", "mlxd-default", "-o", "max_tokens", "40", "Say hello"),
    "whole": llm("-m", "mlxd-default", "--no-stream", "-o", "max_tokens", "40", "Say hello"),
    "schema": json.loads(llm("-m", "mlxd-tiny", "--schema", json.dumps(STATUS), "-o", "max_tokens", "80",
                             "Report the status")),
}
if os.environ.get("NOTE"):
    out["tool_answer"] = llm("-m", "mlxd-tiny", "--functions", READ_NOTE, "-o", "max_tokens", "64",
                             f"Read the note at {os.environ['NOTE']}")
print(json.dumps(out))
