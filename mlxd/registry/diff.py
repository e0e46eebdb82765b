"""Old registry vs new registry: what hot reload must do for each model.

Pure functions over frozen values. Each model lands in exactly one class:

- ``added``: a new name; load it lazily (or now, if it is preloaded).
- ``removed``: gone; drain its requests, then unload.
- ``reload``: a field in ``ModelSpec.RELOAD_FIELDS`` changed, so what is in
  memory is wrong; drain, then load again.
- ``live``: other fields changed (aliases, defaults, timeouts, queue limits):
  apply them to the resident engine without unloading.
- ``renamed``: the name changed but the files and every reload-relevant
  setting are the same, so the resident engine is kept under the new name
  (other fields may also have changed; they apply live).
- ``unchanged``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from mlxd.registry.model import ModelSpec, Registry

ChangeKind = Literal["added", "removed", "reload", "live", "renamed", "unchanged"]

# Where the daemon listens, and bounds fixed when the server is built, need a
# restart; other server fields apply live.
SERVER_RESTART_FIELDS = ("host", "port", "max_connections", "header_timeout_s", "max_image_memory_bytes")


@dataclass(frozen=True)
class ModelChange:
    kind: ChangeKind
    # The name in the new registry; for ``removed``, the old name.
    name: str
    old: ModelSpec | None
    new: ModelSpec | None
    # Fields whose values differ between ``old`` and ``new`` (empty for
    # added/removed/unchanged; includes ``name`` for renamed).
    fields: tuple[str, ...] = ()

    @property
    def old_name(self) -> str | None:
        return self.old.name if self.old is not None else None


@dataclass(frozen=True)
class RegistryDiff:
    changes: tuple[ModelChange, ...]
    manager_fields: tuple[str, ...] = ()
    server_fields: tuple[str, ...] = ()
    # Backends added, removed or edited. Edits apply to requests that start
    # after the reload; the ones in flight finish where they began.
    backends: tuple[str, ...] = ()
    # Failover entries added, removed or edited (targets, strategy, ...):
    # they hold nothing, so an edit applies to the next request; requests
    # in flight keep the target they hold. Implicit `backend:model` targets
    # come and go as models of their own.
    failovers: tuple[str, ...] = ()
    # Apps added, removed or edited (a key, a scope, a limit): the next
    # request is checked against the new list, so a removed app's key is
    # refused from the moment the reload applies.
    apps: tuple[str, ...] = ()

    def names(self, kind: ChangeKind) -> tuple[str, ...]:
        return tuple(c.name for c in self.changes if c.kind == kind)

    @property
    def added(self) -> tuple[str, ...]:
        return self.names("added")

    @property
    def removed(self) -> tuple[str, ...]:
        return self.names("removed")

    @property
    def reload(self) -> tuple[str, ...]:
        return self.names("reload")

    @property
    def live(self) -> tuple[str, ...]:
        return self.names("live")

    @property
    def unchanged(self) -> tuple[str, ...]:
        return self.names("unchanged")

    @property
    def renamed(self) -> tuple[tuple[str, str], ...]:
        """``(old_name, new_name)`` pairs."""
        return tuple((c.old.name, c.name) for c in self.changes if c.kind == "renamed" and c.old)

    @property
    def server_needs_restart(self) -> bool:
        return any(f in SERVER_RESTART_FIELDS for f in self.server_fields)

    @property
    def is_empty(self) -> bool:
        return (
            all(c.kind == "unchanged" for c in self.changes)
            and not self.manager_fields
            and not self.server_fields
            and not self.backends
            and not self.failovers
            and not self.apps
        )

    def summary(self) -> str:
        """One line for the log, e.g. ``added: c; reload: a; renamed: b->b2``."""
        parts = [
            f"{kind}: {', '.join(self.names(kind))}"
            for kind in ("added", "removed", "reload", "live")
            if self.names(kind)
        ]
        if self.renamed:
            parts.append("renamed: " + ", ".join(f"{a}->{b}" for a, b in self.renamed))
        if self.manager_fields:
            parts.append("manager: " + ", ".join(self.manager_fields))
        if self.server_fields:
            parts.append("server: " + ", ".join(self.server_fields))
        if self.backends:
            parts.append("backends: " + ", ".join(self.backends))
        if self.failovers:
            parts.append("failover: " + ", ".join(self.failovers))
        if self.apps:
            parts.append("apps: " + ", ".join(self.apps))
        return "; ".join(parts) or "no changes"


def _changed(old: object, new: object) -> tuple[str, ...]:
    return tuple(f.name for f in fields(new) if getattr(old, f.name) != getattr(new, f.name))  # type: ignore[arg-type]


def _engine_identity(spec: ModelSpec) -> tuple[object, ...]:
    """What decides whether a resident engine can serve this spec as is."""
    return tuple(getattr(spec, f) for f in ModelSpec.RELOAD_FIELDS)


def diff_registries(old: Registry, new: Registry) -> RegistryDiff:
    old_by_name = {m.name: m for m in old.models}
    new_names = {m.name for m in new.models}
    removed_pool = [m for m in old.models if m.name not in new_names]

    changes: list[ModelChange] = []
    for spec in new.models:
        before = old_by_name.get(spec.name)
        if before is not None:
            changes.append(_classify(before, spec))
            continue
        # A new name: is it an old model under a new name? Match the first
        # removed model with the same engine identity, one to one.
        twin = next(
            (m for m in removed_pool if _engine_identity(m) == _engine_identity(spec)), None
        )
        if twin is not None:
            removed_pool.remove(twin)
            changes.append(ModelChange("renamed", spec.name, twin, spec, _changed(twin, spec)))
        else:
            changes.append(ModelChange("added", spec.name, None, spec))
    changes += [ModelChange("removed", m.name, m, None) for m in removed_pool]
    return RegistryDiff(
        changes=tuple(changes),
        manager_fields=_changed(old.manager, new.manager),
        server_fields=_changed(old.server, new.server),
        backends=_changed_names(old.backends, new.backends),
        failovers=_changed_names(old.failovers, new.failovers),
        apps=_changed_apps(old.apps, new.apps),
    )


def _changed_apps(old: tuple[Any, ...] | None, new: tuple[Any, ...] | None) -> tuple[str, ...]:
    if old is None and new is None:
        return ()
    if (old is None) != (new is None):
        # Turning apps on (or off) changes who may ask for anything.
        return (*_changed_names(old or (), new or ()), "(apps on)" if new is not None else "(apps off)")
    return _changed_names(old or (), new or ())


def _changed_names(old: tuple[Any, ...], new: tuple[Any, ...]) -> tuple[str, ...]:
    """Names added, removed or edited between two tuples of named specs."""
    before = {b.name: b for b in old}
    after = {b.name: b for b in new}
    return tuple(sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n)))


def _classify(old: ModelSpec, new: ModelSpec) -> ModelChange:
    changed = tuple(new.changed_fields(old))
    if not changed:
        return ModelChange("unchanged", new.name, old, new)
    kind: ChangeKind = "reload" if new.needs_reload_from(old) else "live"
    return ModelChange(kind, new.name, old, new, changed)
