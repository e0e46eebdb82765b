"""Where the ``mlxd`` console script pointed before the command line moved to
``mlxd.cli``. A script installed from an older checkout still imports this;
``pip install -e .`` writes one that imports ``mlxd.cli.main`` directly, after
which this module can go."""

from __future__ import annotations


def main() -> None:
    from mlxd.cli.main import main as run

    run()
