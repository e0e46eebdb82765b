"""One daemon per state directory: a second one fails fast instead of
fighting the first. The lock is an flock, so a killed daemon's lock is
released by the kernel and the next start simply takes it over."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mlxd.errors import ConfigError


class StateLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "mlxd.lock"
        self._handle: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"another mlxd (pid {holder}) is already running with this state directory; "
                "stop it first, or give this one its own --state-dir (MLXD_STATE_DIR)",
                file=str(self.path),
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._handle = fd

    def release(self) -> None:
        if self._handle is not None:
            os.close(self._handle)
            self._handle = None
