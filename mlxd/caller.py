"""Who is asking: made once, at the gatekeeper, from the request's
credentials, and carried through planning, the lease, accounting and the
request log, so a per-caller policy has one value to read.

Today a caller is the API key it used, by name (a short hash of it; never
the key itself) and whether that key is an admin key; ``app`` is for the
per-app policies to come.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


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
    # ``server.read_only_keys`` are not; with no keys set, whoever reaches
    # the daemon (loopback, by default) owns it.
    admin: bool = True

    @property
    def label(self) -> str:
        """For logs: the app when known, else the key, else ``-``."""
        return self.app or self.key or "-"

    @property
    def name(self) -> str:
        """What the activity log, the request list and status show."""
        return self.app or self.key or "local"


# No key configured.
ANONYMOUS = Caller()
# Routes the gatekeeper does not check (the page, /health) have no caller.
NOBODY = Caller(key="anonymous", admin=False)


def key_name(key: str) -> str:
    """The name a key is shown by: a short hash of it."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]
