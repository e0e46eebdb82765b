"""From settings and a registry file to a running daemon and an exit status."""

from __future__ import annotations

import logging
from pathlib import Path

from mlxd.daemon.build import build_daemon
from mlxd.daemon.lockfile import StateLock
from mlxd.daemon.logs import configure_logging
from mlxd.daemon.reload import log_problems
from mlxd.registry.loader import load_registry
from mlxd.settings import DaemonSettings, effective

log = logging.getLogger("mlxd")


def run_daemon(settings: DaemonSettings, registry_path: Path) -> int:
    """Serve until a signal drains the daemon. Raises ConfigError for bad
    input (the CLI exits 2); returns 0 after a clean drain."""
    configure_logging(settings.log_format, settings.log_level)
    registry = load_registry(registry_path)
    eff = effective(settings, registry.server)
    lock = StateLock(eff.state_dir)
    lock.acquire()
    try:
        daemon = build_daemon(settings, registry)
        blas = daemon.ctx.blas
        log.info("mlxd serving %d models from %s on http://%s:%d", len(registry.models), registry_path,
                 eff.server.host, eff.server.port)
        log_problems(registry)
        log.info("BLAS: %s", blas["active"])
        if blas.get("warning"):
            log.warning("%s", blas["warning"])
        if not eff.server.api_keys and eff.server.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("no API keys configured and bound to %s: anyone on the network can use the models",
                        eff.server.host)
        server = daemon.server
        server.run()
        if not server.started:
            log.error("the server did not start (is port %d already in use?)", eff.server.port)
            return 1
        return 0
    finally:
        lock.release()
