"""The entries of ``models.yaml`` that hold no model here: ``backends:``,
entries served by a backend, and failover entries over several targets
(an entry's name, or ``backend:model`` for a model with no entry, which
becomes an implicit remote entry)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxd.registry.apps import unset_variable
from mlxd.registry.document import Loc
from mlxd.registry.kinds import a_model_of
from mlxd.registry.model import BackendSpec, FailoverSpec, ModelSpec, PrefixCacheSpec, template_pairs
from mlxd.registry.schema import FAILOVER_KEYS, REMOTE_KEYS, ModelEntry
from mlxd.registry.sections import Sections


class RemoteEntries:
    """Builds backends, remote entries and failover entries; ``implicit``
    collects the ``backend:model`` targets by that name."""

    def __init__(self, sections: Sections, env: Mapping[str, str] | None) -> None:
        self.s = sections
        self.env = env
        self.implicit: dict[str, ModelSpec] = {}

    def backends(self) -> tuple[BackendSpec, ...]:
        env = os.environ if self.env is None else self.env
        specs = []
        for name, b in self.s.parsed.backends.items():
            if b.api_key_env is not None and not env.get(b.api_key_env):
                raise self.s.doc.error(("backends", name, "api_key_env"),
                                       unset_variable(b.api_key_env, f"the key for `{name}`"))
            specs.append(
                BackendSpec(
                    name=name,
                    url=b.url,
                    kind=b.kind,
                    api_key_env=b.api_key_env,
                    max_concurrency=b.max_concurrency,
                    connect_timeout_s=b.timeouts.connect,
                    first_byte_timeout_s=b.timeouts.first_byte,
                    idle_timeout_s=b.timeouts.idle,
                    poll_interval_s=b.poll_interval_s,
                )
            )
        return tuple(specs)

    def model(self, i: int, entry: ModelEntry) -> ModelSpec:
        """An entry served by a backend: nothing local to resolve, size or
        load, so it costs nothing against the memory budget."""
        here: Loc = ("models", i)
        backend = self.s.parsed.backends.get(entry.backend or "")
        if backend is None:
            known = ", ".join(f"`{n}`" for n in self.s.parsed.backends) or "none are defined"
            raise self.s.doc.error(
                (*here, "backend"), f"unknown backend `{entry.backend}` (backends: {known})"
            )
        local = [k for k in entry.model_fields_set if k not in REMOTE_KEYS]
        if local:
            key = min(local, key=lambda k: self.s.doc.line_of((*here, k)))
            raise self.s.doc.error(
                (*here, key),
                f"`{key}` is a local-model setting; `{entry.name}` is served by backend "
                f"`{entry.backend}` (a remote entry takes only: {', '.join(REMOTE_KEYS)})",
            )
        self.s.check_kind_keys(i, entry, self.s.kinds[entry.kind or "text"])
        return self._remote_spec(
            entry.name,
            entry.backend or "",
            entry.remote_model or entry.name,
            aliases=tuple(entry.aliases),
            description=entry.description,
            max_queue=entry.max_queue,
            defaults=self.s.sampling(i, entry),
            local_image_dir=self.s.image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
            chat_template_kwargs=template_pairs(entry.chat_template_kwargs),
            # What the backend's model is (embedding, rerank: relayed on those routes).
            kind=entry.kind or "text",
        )

    def _remote_spec(self, name: str, backend: str, remote_model: str, **given: Any) -> ModelSpec:
        return ModelSpec(
            name=name,
            path=Path(),
            source=f"{backend}:{remote_model}",
            idle_unload_seconds=0.0,
            max_concurrency=self.s.parsed.backends[backend].max_concurrency,
            prefix_cache=PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False),
            backend=backend,
            remote_model=remote_model,
            **given,
        )

    def failover(self, i: int, entry: ModelEntry, built: Mapping[str, ModelSpec]) -> FailoverSpec:
        """``built``: the entries' specs by name, whose kinds the targets' must be."""
        here: Loc = ("models", i)
        other = [k for k in entry.model_fields_set if k not in FAILOVER_KEYS]
        if other:
            key = min(other, key=lambda k: self.s.doc.line_of((*here, k)))
            raise self.s.doc.error(
                (*here, key),
                f"`{key}` is not a failover setting; `{entry.name}` is served by its targets, which "
                f"hold the models (a failover entry takes only: {', '.join(FAILOVER_KEYS)})",
            )
        targets: list[str] = []
        for j, written in enumerate(entry.targets or ()):
            target = self._target((*here, "targets", j), written)
            if target in targets:
                raise self.s.doc.error((*here, "targets", j), f"`{written}` is listed twice")
            spec = built.get(target) or self.implicit[target]
            if not self.s.kinds[spec.kind].generates:
                # Only the generation routes resolve a failover entry: an
                # embedding, rerank or audio request naming it is a 400.
                raise self.s.doc.error((*here, "targets", j), f"`{written}` is {a_model_of(spec.kind)}; a failover "
                                       "entry's targets are chat models (embedding, rerank and audio requests "
                                       "name one model)")
            targets.append(target)
        return FailoverSpec(
            name=entry.name,
            targets=tuple(targets),
            strategy=entry.strategy or "warm",
            aliases=tuple(entry.aliases),
            description=entry.description,
            defaults=self.s.sampling(i, entry),
            local_image_dir=self.s.image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
        )

    def _target(self, at: Loc, written: str) -> str:
        """A failover target: an entry of this file (by name or alias), or
        ``backend:model`` for a model on a backend that has no entry."""
        named = next((e for e in self.s.parsed.models if written == e.name or written in e.aliases), None)
        backend, colon, model = written.partition(":")
        on_backend = bool(colon and model) and backend in self.s.parsed.backends
        if named is not None and on_backend:
            raise self.s.doc.error(
                at, f"`{written}` is both an entry's name and a model on backend `{backend}`; rename the entry"
            )
        if named is not None:
            if named.targets is not None:
                raise self.s.doc.error(
                    at, f"`{written}` is a failover entry itself; a target must be a model (local or remote)"
                )
            return named.name
        if not on_backend:
            known = ", ".join(f"`{n}`" for n in self.s.parsed.backends) or "none are defined"
            raise self.s.doc.error(
                at,
                f"unknown target `{written}`: not an entry of this file, nor `backend:model` on a "
                f"backend under `backends:` ({known})",
            )
        if written not in self.implicit:
            self.implicit[written] = self._remote_spec(written, backend, model, implicit=True)
        return written
