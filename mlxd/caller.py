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
from collections.abc import Collection
from dataclasses import dataclass, field

# Priority classes, most urgent first (the fair queue's order), and their
# weights in it: under sustained contention they take turns 8 : 4 : 1.
PRIORITIES = ("interactive", "default", "bulk")
WEIGHTS = {"interactive": 8.0, "default": 4.0, "bulk": 1.0}
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

    def names_exactly(self, name: str) -> bool:
        """Whether ``models:`` lists ``name`` itself, no glob: the operator
        gave the app that very name, whatever entry answers it (a concrete
        `claude-sonnet-4-5` that a `claude-*` alias serves)."""
        return name in self.models and not any(c in name for c in "*?[")

    def may_call(self, group: str | None) -> bool:
        """Whether this caller may call a route of ``group`` (None: a route
        every key may read)."""
        return group is None or group in self.routes


def class_of(priority: str) -> str:
    return priority if priority in WEIGHTS else "default"


def urgency(priority: str) -> int:
    """Where ``priority``'s class stands in PRIORITIES: 0 is the most urgent."""
    return PRIORITIES.index(class_of(priority))


@dataclass
class Stride:
    """Turns between the priority classes of one queue (stride scheduling):
    each turn advances its class's pass by 1/weight and the smallest pass
    goes next. A class that was not waiting joins at the queue's virtual
    time, one of its own strides past it, as if it had just been served: it
    banks no credit from its idle time and does not jump work that was
    waiting. Residency's fair queue (a model's waiters) and an encoder's
    batch queue (its inputs) each keep one per queue."""

    _passes: dict[str, float] = field(default_factory=dict)
    # The pass of the class served last (a class waiting all along is at or past it).
    _now: float = 0.0

    def pick(self, classes: Collection[str]) -> str | None:
        """Which of ``classes`` (those waiting now) has the next turn."""
        for c in classes:
            if self._passes.get(c, -1.0) < self._now:
                self._passes[c] = self._now + 1.0 / WEIGHTS[c]
        return min(classes, key=lambda c: (self._passes[c], PRIORITIES.index(c)), default=None)

    def served(self, priority: str) -> None:
        """A turn of ``priority``'s class was taken."""
        c = class_of(priority)
        pass_ = self._passes.get(c, self._now)
        self._now = pass_
        self._passes[c] = pass_ + 1.0 / WEIGHTS[c]


# No key configured.
ANONYMOUS = Caller()
# Routes the gatekeeper does not check (the page, /health) have no caller.
NOBODY = Caller(key="anonymous", admin=False)


def key_name(key: str) -> str:
    """The name a key is shown by: a short hash of it."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:8]
