"""aider against mlxd as its docs set up an OpenAI-compatible API: an
`openai/` model with --openai-api-base, one --message, --yes --no-git, in a
scratch folder; the answer read back from the chat history aider writes."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

AIDER = str(Path(sys.executable).parent / "aider")
work = tempfile.mkdtemp()
run = subprocess.run(
    [AIDER, "--model", "openai/default", "--openai-api-base", os.environ["MLXD_URL"] + "/v1",
     "--openai-api-key", "unused", "--message", "Say hello", "--yes", "--no-git",
     "--no-check-update", "--no-analytics", "--no-show-model-warnings", "--no-pretty"],
    cwd=work, env={**os.environ, "HOME": work}, capture_output=True, text=True, stdin=subprocess.DEVNULL,
)
history = Path(work, ".aider.chat.history.md")
# After the message: the answer, then aider's own "> ..." notes (token counts, errors).
after = history.read_text().split("#### Say hello", 1)[-1] if history.exists() else ""
reply = "\n".join(line for line in after.splitlines() if not line.startswith(">")).strip()
print(json.dumps({"rc": run.returncode, "reply": reply, "stdout": run.stdout[-2000:], "stderr": run.stderr[-2000:]}))
