"""``python -m mlxd.service``: the service commands without the rest of the CLI."""

from mlxd.service.cli import main

main()
