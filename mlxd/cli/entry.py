"""The ``mlxd`` command's first step: ``serve`` re-executes itself with
OpenBLAS preloaded before anything heavy is imported.

LD_PRELOAD only takes at process start, so ``serve`` starts twice on Linux.
Deciding that here, before the CLI's own imports (typer, the settings, the
command modules: 0.4-0.9 s on the 2-core CPU), keeps the first start to
what the decision needs; the second one runs the command.
"""

from __future__ import annotations

import signal
import sys

from mlxd.cli.reexec import reexec_with_openblas


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        # SIGHUP reloads the registry once the daemon serves
        # (mlxd.daemon.server); until then its default action ended the
        # daemon in the middle of its start (a process exit launchd and
        # systemd count as a crash). Ignored, which the exec below keeps,
        # until the server's handler takes its place.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        reexec_with_openblas()
    from mlxd.cli.main import main as run

    run()
