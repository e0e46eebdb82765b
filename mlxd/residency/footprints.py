"""Measured footprints, remembered across restarts so admission after a
restart already knows what a model really costs."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from mlxd.registry.model import ModelSpec

log = logging.getLogger("mlxd.residency")


def _key(spec: ModelSpec) -> str:
    # Same folder and same settings that size the KV cache: same footprint.
    return f"{spec.path}|ctx={spec.max_context}|conc={spec.max_concurrency}|kv={spec.kv_bits}"


class FootprintStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, int] = {}
        try:
            self._data = {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("ignoring unreadable %s: %s", path, exc)

    def known(self, specs: list[ModelSpec] | tuple[ModelSpec, ...]) -> dict[str, int]:
        return {s.name: self._data[_key(s)] for s in specs if _key(s) in self._data}

    def remember(self, spec: ModelSpec, nbytes: int) -> None:
        self._data[_key(spec)] = int(nbytes)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".footprints.", dir=self.path.parent)
            with os.fdopen(fd, "w") as handle:
                json.dump(self._data, handle, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("could not remember footprints in %s: %s", self.path, exc)
