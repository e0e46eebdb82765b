"""From settings and a registry file to a running daemon and an exit status."""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path

from mlxd.daemon.build import build_daemon
from mlxd.daemon.lockfile import StateLock
from mlxd.daemon.logs import configure_logging
from mlxd.daemon.reload import log_problems
from mlxd.errors import StartupError
from mlxd.registry.loader import load_registry
from mlxd.settings import DaemonSettings, effective

log = logging.getLogger("mlxd")


def run_daemon(settings: DaemonSettings, registry_path: Path) -> int:
    """Serve until a signal drains the daemon. Raises ConfigError for bad
    input (the CLI exits 2); returns 0 after a clean drain."""
    with configure_logging(settings.log_format, settings.log_level):
        return _run(settings, registry_path)


def _run(settings: DaemonSettings, registry_path: Path) -> int:
    registry = load_registry(registry_path)
    eff = effective(settings, registry.server)
    # Both before any model work: a taken port or an unusable state dir is a
    # one-line error (exit 2), not a traceback after seconds of start-up.
    check_port_free(eff.server.host, eff.server.port)
    lock = StateLock(eff.state_dir)
    try:
        lock.acquire()
    except OSError as exc:
        raise StartupError(
            f"the state directory {eff.state_dir} cannot be used ({exc.strerror or exc}); "
            "fix its permissions or pass --state-dir"
        ) from None
    try:
        daemon = build_daemon(settings, registry)
        blas = daemon.ctx.blas
        log.info("mlxd serving %d models from %s on http://%s:%d", len(registry.models), registry_path,
                 eff.server.host, eff.server.port)
        log_problems(registry)
        log.info("BLAS: %s", blas["active"])
        if blas.get("warning"):
            log.warning("%s", blas["warning"])
        keyed = eff.server.api_keys or eff.server.read_only_keys or registry.apps is not None
        if registry.apps == () and not (eff.server.api_keys or eff.server.read_only_keys):
            log.warning("`apps:` is empty and no API key is set: every request will be refused (401); "
                        "add an app to %s, or leave `apps:` out", registry_path)
        if not keyed and eff.server.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("no API keys configured and bound to %s: anyone on the network can use the models",
                        eff.server.host)
        # A remote entry loads nothing here (its row imports nothing): a front
        # with only those never needs mlx-lm.
        daemon.imports.start((registry.kind_of(m).name for m in registry.models), registry.kinds)
        server = daemon.server
        server.run()
        if not server.started:
            log.error("the server did not start (is port %d already in use?)", eff.server.port)
            return 1
        return 0
    finally:
        lock.release()


def check_port_free(host: str, port: int) -> None:
    """Bind the address as uvicorn will (SO_REUSEADDR) and let it go again."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot bind to {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"port {port} on {host} is already in use (another mlxd?); stop it or pass --port"
                ) from None
            raise StartupError(f"cannot bind to {host}:{port}: {exc.strerror or exc}") from None
