"""One line of advice after a launchctl/systemctl failure.

The tool's own stderr is always shown verbatim first; these hints only say
what to try next. Matching is on the tool's words and exit codes as they
appear on current macOS and systemd, so unknown failures get a generic hint
rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence

_REINSTALL = "`mlxd service uninstall`, then `mlxd service install --config ...`"


def hint_for(argv: Sequence[str], returncode: int, stderr: str) -> str:
    tool = argv[0].rsplit("/", 1)[-1] if argv else ""
    verb = next((a for a in argv[1:] if not a.startswith("-")), "")
    text = stderr.lower()
    if returncode == 127 and "not found" in text:
        return (
            f"`{tool}` is not on PATH: is this the right platform? "
            "(launchd is macOS only, systemd is Linux only)"
        )
    if tool == "launchctl":
        return _launchctl_hint(verb, returncode, text)
    if tool in ("systemctl", "journalctl"):
        return _systemd_hint(returncode, text)
    if tool == "tail" and "no such file" in text:
        return "no log files yet: is the service installed? (`mlxd service status`)"
    return "see the message above; `mlxd service status` shows the service's state"


def _launchctl_hint(verb: str, returncode: int, text: str) -> str:
    if "operation not permitted" in text or "permission denied" in text:
        return "not permitted: a system-wide service (--system) must be installed with sudo"
    if verb == "bootstrap" and (returncode in (5, 37) or "input/output error" in text):
        return (
            "the service may already be loaded: try `mlxd service restart`, "
            f"or {_REINSTALL}"
        )
    if returncode in (3, 113) or "could not find" in text or "no such process" in text:
        return f"the service is not loaded: run `mlxd service install --config ...` (or {_REINSTALL})"
    return f"see `mlxd service logs`; if the service is stuck, {_REINSTALL}"


def _systemd_hint(returncode: int, text: str) -> str:
    if "failed to connect to bus" in text or "xdg_runtime_dir" in text:
        return (
            "no systemd user session here (ssh, sudo or a container): log in normally, "
            "or run `loginctl enable-linger $USER` and open a new session"
        )
    if "access denied" in text or "permission denied" in text or "interactive authentication" in text:
        return "not permitted: a system-wide service (--system) must be managed with sudo"
    if "not found" in text or "does not exist" in text or "not loaded" in text:
        return "the unit is not installed: run `mlxd service install --config ...`"
    if returncode == 3:
        return "the service is not running: `mlxd service logs` shows why it stopped"
    return "see `mlxd service logs` for the daemon's own messages"
