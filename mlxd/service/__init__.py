"""Running mlxd as a service: a launchd agent on macOS, a systemd unit on Linux.

``mlxd.service.cli.service_app`` is the ``mlxd service`` command group.
"""
