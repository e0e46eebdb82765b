"""The smallest registry a service install accepts: its models need not be
on disk yet (the installer checks the file's YAML and keys, not the models)."""

from __future__ import annotations


def service_registry(grace: object = None) -> str:
    server = f"server:\n  shutdown_grace_seconds: {grace}\n" if grace is not None else ""
    return server + "models:\n  - name: chat\n    path: /models/not-fetched-yet\n"
