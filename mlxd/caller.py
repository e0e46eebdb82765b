"""Who is asking: made once, at the gatekeeper, from the request's
credentials, and carried through planning, the lease, accounting and the
request log, so a per-caller policy has one value to read.

Today a caller is the API key it used, by name (``key-1`` for the first of
``server.api_keys``; never the key itself); ``app`` is for the per-app
policies to come.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    # The API key's name; None when the daemon asks for no key.
    key: str | None = None
    # The application behind the key, once apps are configured.
    app: str | None = None

    @property
    def label(self) -> str:
        """For logs: the app when known, else the key, else ``-``."""
        return self.app or self.key or "-"


ANONYMOUS = Caller()


def key_name(index: int) -> str:
    """The name of the ``index``-th (0-based) of ``server.api_keys``."""
    return f"key-{index + 1}"
