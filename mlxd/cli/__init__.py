"""The `mlxd` command line and its client for a running daemon."""
