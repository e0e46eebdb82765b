"""Who is asking: made once, at the gatekeeper, from the request's
credentials, and carried through planning, the lease, accounting and the
request log, so every per-app policy has one value to read.

A caller is the API key it used, by name (a short hash of it; never the key
itself), whether it may change the daemon, and, once ``apps:`` is set, the
app the key belongs to with that app's scope: the model names it may use,
the route groups it may call and its priority class.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass

# Priority classes, most urgent first (the fair queue's order).
PRIORITIES = ("interactive", "default", "bulk")
# The route groups an app's ``routes:`` may name; the others (status, the
# model list, the caller's own requests) every key may read, and the admin
# routes are the admin flag's.
ROUTE_GROUPS = ("generation", "embeddings", "audio")


@dataclass(frozen=True)
class Caller:
    # The API key's name (``key:`` and a short hash of it: stable when the
    # keys are reordered, never the key itself); None when the daemon asks
    # for no key.
    key: str | None = None
    # The application behind the key, once apps are configured.
    app: str | None = None
    # Whether it may change the daemon (load, unload, pin, reload, clear
    # caches, capture): ``server.api_keys`` are admin keys,
    # ``server.read_only_keys`` are not, an app is what its ``admin:`` says;
    # with no keys set, whoever reaches the daemon (loopback, by default)
    # owns it.
    admin: bool = True
    # Glob patterns of the model names it may use (an app's ``models:``).
    models: tuple[str, ...] = ("*",)
    # The route groups it may call (an app's ``routes:``).
    routes: tuple[str, ...] = ROUTE_GROUPS
    priority: str = "default"

    @property
    def label(self) -> str:
        """For logs: the app when known, else the key, else ``-``."""
        return self.app or self.key or "-"

    @property
    def name(self) -> str:
        """What the activity log, the request list and status show."""
        return self.app or self.key or "local"

    def may_use(self, *names: str) -> bool:
        """Whether one of ``names`` (the name asked for, the entry it
        resolved to) falls in this caller's ``models:``."""
        return any(fnmatch.fnmatchcase(n, pattern) for n in names for pattern in self.models)

    def may_call(self, group: str | None) -> bool:
        """Whether this caller may call a route of ``group`` (None: a route
        every key may read)."""
        return group is None or group in self.routes


# No key configured.
ANONYMOUS = Caller()
# Routes the gatekeeper does not check (the page, /health) have no caller.
NOBODY = Caller(key="anonymous", admin=False)


def key_name(key: str) -> str:
    """The name a key is shown by: a short hash of it."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]
