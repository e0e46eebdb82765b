"""``models.yaml`` -> :class:`~mlxd.registry.model.Registry`.

Every problem is a :class:`~mlxd.errors.ConfigError` naming the file, the
1-based line and the dotted key (``models[1].max_context``). Problems in the
file itself are raised. Problems with one model's files on disk (a missing
folder, corrupt weights, a bad config.json) are not: that model comes back
``broken`` and its located error is in ``Registry.problems``. The YAML is
composed into a node tree once (``document.py``); the shared sections are
built once (``sections.py``), then each entry by its concern
(``local_entries.py``, ``remote_entries.py``).
"""

from __future__ import annotations

import hashlib
import logging
import stat
from collections.abc import Mapping
from pathlib import Path

from mlxd.errors import ConfigError
from mlxd.registry.apps import build_apps
from mlxd.registry.document import Document, Loc, key_path
from mlxd.registry.kinds import KINDS, ModelKind
from mlxd.registry.local_entries import LocalEntries
from mlxd.registry.model import ModelSpec, Registry
from mlxd.registry.remote_entries import RemoteEntries
from mlxd.registry.resolve import Downloader
from mlxd.registry.schema import ModelEntry, RegistryFile, physical_memory_bytes
from mlxd.registry.sections import Sections
from mlxd.registry.sizing import format_bytes
from mlxd.registry.speculative import resolve_drafts

logger = logging.getLogger(__name__)

TEXT_FILE_LABEL = "<string>"


def load_registry(
    path: Path,
    *,
    env: Mapping[str, str] | None = None,
    physical_memory: int | None = None,
    downloader: Downloader | None = None,
    kinds: Mapping[str, ModelKind] = KINDS,
) -> Registry:
    """Read, validate and resolve the registry file at ``path``.

    ``env`` (the Hugging Face cache variables), ``physical_memory`` (for
    ``"70%"`` budgets) and ``downloader`` (for ``allow_download``) default to
    the real ones; tests pass their own. ``kinds``: the table of model kinds
    a ``kind:`` may name (``mlxd.registry.kinds``).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("registry file not found", file=str(path)) from None
    except IsADirectoryError:
        raise ConfigError("is a folder, not a registry file", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read the registry file: {exc.strerror}", file=str(path)
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None
    registry = _load(text, data, path, env=env, physical_memory=physical_memory, downloader=downloader, kinds=kinds)
    _warn_if_keys_readable(path, registry)
    return registry


def _warn_if_keys_readable(path: Path, registry: Registry) -> None:
    # As for an API keys file: keys in a file others can read are no secret.
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if registry.server.api_keys and mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("%s holds server.api_keys and can be read by other users; chmod 600 it "
                       "(or keep the keys in an api_keys_file)", path)


def load_registry_text(
    text: str,
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    physical_memory: int | None = None,
    downloader: Downloader | None = None,
    kinds: Mapping[str, ModelKind] = KINDS,
) -> Registry:
    """Like :func:`load_registry` for text in hand; ``path`` (which need not
    exist) names the file in errors and anchors relative model paths."""
    return _load(
        text,
        text.encode("utf-8"),
        Path(path) if path is not None else None,
        env=env,
        physical_memory=physical_memory,
        downloader=downloader,
        kinds=kinds,
    )


def _load(
    text: str,
    raw: bytes,
    path: Path | None,
    *,
    env: Mapping[str, str] | None,
    physical_memory: int | None,
    downloader: Downloader | None,
    kinds: Mapping[str, ModelKind],
) -> Registry:
    label = str(path) if path is not None else TEXT_FILE_LABEL
    doc = Document.parse(text, label)
    memory = physical_memory or physical_memory_bytes()
    parsed = doc.validate(memory, kinds)
    base_dir = path.absolute().parent if path is not None else Path.cwd()
    sections = Sections(doc, parsed, base_dir, memory, kinds)
    local, remote = LocalEntries(sections, env, downloader), RemoteEntries(sections, env)
    manager, server, backends = sections.manager(), sections.server(), remote.backends()
    _check_names(doc, parsed)
    entries = list(enumerate(parsed.models))
    models = [_entry(doc, local, remote, i, entry) for i, entry in entries if entry.targets is None]
    index = {entry.name: i for i, entry in entries}
    models = resolve_drafts(doc, models, index, local.draft_bytes, local.check_fits)
    built = {spec.name: spec for spec in models}
    failovers = tuple(remote.failover(i, entry, built) for i, entry in entries if entry.targets is not None)
    registry = Registry(
        source_path=path.absolute() if path is not None else None,
        file_hash=hashlib.sha256(raw).hexdigest(),
        manager=manager,
        server=server,
        backends=backends,
        # The failover entries' implicit targets last.
        models=(*models, *remote.implicit.values()),
        failovers=failovers,
        apps=build_apps(doc, parsed.apps, base_dir, env, server),
        problems=tuple(local.problems),
        kinds=kinds,
    )
    _warn_if_pinned_do_not_fit(registry, label)
    return registry


def _entry(doc: Document, local: LocalEntries, remote: RemoteEntries, i: int, entry: ModelEntry) -> ModelSpec:
    here: Loc = ("models", i)
    if entry.strategy is not None:
        raise doc.error((*here, "strategy"), "`strategy` is for failover entries; list the models under `targets:`")
    return remote.model(i, entry) if entry.backend is not None else local.model(i, entry)


def _check_names(doc: Document, parsed: RegistryFile) -> None:
    used: dict[str, Loc] = {}
    for i, entry in enumerate(parsed.models):
        candidates: list[tuple[str, Loc]] = [(entry.name, ("models", i, "name"))]
        candidates += [(a, ("models", i, "aliases", j)) for j, a in enumerate(entry.aliases)]
        for name, loc in candidates:
            if name in used:
                first = used[name]
                where = f"{key_path(first)} on line {doc.line_of(first)}"
                raise doc.error(loc, f"the name `{name}` is already used by {where}")
            used[name] = loc


def _warn_if_pinned_do_not_fit(registry: Registry, label: str) -> None:
    pinned = [m for m in registry.models if m.pinned]
    total = sum(m.charge_bytes for m in pinned)
    budget = registry.manager.memory_budget_bytes
    if total > budget:
        logger.warning(
            "%s: the pinned models (%s) need %s together but the budget is %s; "
            "they cannot all stay resident",
            label,
            ", ".join(m.name for m in pinned),
            format_bytes(total),
            format_bytes(budget),
        )
