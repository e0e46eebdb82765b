"""Hot reload of models.yaml: validate first, then apply only the difference.

Four triggers end in ``Reloader.reload``: the file watcher, SIGHUP,
``POST /v1/admin/reload`` and ``mlxd reload`` (which calls the endpoint).
Reloads are serialized. The new file is fully validated before anything
changes; an invalid file leaves the old registry serving and its error in
``/v1/status`` until a valid file replaces it. A valid one is diffed against
the registry in use and handed to the residency manager, which keeps every
engine it can: live changes apply at once, reload-class changes drain the old
engine before loading the new one, removed models finish their requests first.

The watcher watches the folder(s) of the file, not the file: editors replace
files by renaming, configuration managers swap symlinks, and an inode-level
watch would follow the old file. Only events on the registry's own names
count (the file, each symlink on the way to its target, the target): the
folder may be a home directory, or hold the daemon's own log, and anything
else that moves there must not keep the debounce from settling. Events only
say "look again"; whether anything changed is decided by the file's content hash.

The key files the registry names (an app's ``key_file``, the daemon's
``--api-keys-file``) are watched the same way: a key rotated in its file
(a leaked one revoked) applies at once, as an edit of the registry does;
before, it waited for the next reload, and the old key kept working.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from watchfiles import awatch

from mlxd.api.context import DaemonContext
from mlxd.settings import DaemonSettings, EffectiveSettings, effective
from mlxd.errors import ConfigError, ShuttingDown, describe_exception
from mlxd.files import file_sha256
from mlxd.registry.diff import SERVER_RESTART_FIELDS, RegistryDiff, diff_registries
from mlxd.registry.loader import load_registry
from mlxd.waiting import event_set_within
from mlxd.registry.model import Registry, ServerSpec

log = logging.getLogger("mlxd.reload")

# Long enough to cover an editor's write-rename-chmod sequence or a symlink
# swap, short enough that an edit feels immediate.
DEFAULT_DEBOUNCE_S = 0.3


def file_digest(path: Path) -> str | None:
    """sha256 of what ``path`` points at now; None while it is missing."""
    try:
        return file_sha256(path).hexdigest()
    except OSError:
        return None


class Reloader:
    """Applies the registry file at ``path`` to a running daemon.

    ``settings`` are the daemon's own (CLI flags and environment): they are
    merged over each new file's ``server:`` section, so an override keeps
    winning after a reload.
    """

    def __init__(
        self,
        ctx: DaemonContext,
        settings: DaemonSettings,
        path: Path,
        *,
        debounce_s: float = DEFAULT_DEBOUNCE_S,
        loader: Callable[[Path], Registry] | None = None,
    ) -> None:
        self.ctx = ctx
        self.settings = settings
        self.path = Path(path)
        self.debounce_s = debounce_s
        # The file is read again with the kinds table it was first read with.
        self._loader = loader or (lambda p: load_registry(p, kinds=ctx.registry.kinds))
        self._lock = asyncio.Lock()
        # The content last looked at, valid or not: the watcher skips events
        # that leave it unchanged (touch, chmod, a neighbour's temp file).
        self._seen_hash: str | None = ctx.config.file_hash
        # The same for the key files, together (``key_files``).
        self._seen_keys = self._keys_digest()
        self._watcher: ConfigWatcher | None = None

    def key_files(self) -> tuple[Path, ...]:
        """The files keys are read from: the apps' of the registry in use, the daemon's keys file."""
        apps = self.ctx.registry.apps or ()
        found = [a.key_file for a in apps if a.key_file is not None]
        if self.settings.api_keys_file is not None:
            found.append(self.settings.api_keys_file.expanduser())
        return tuple(found)

    def _keys_digest(self) -> tuple[str | None, ...]:
        return tuple(file_digest(path) for path in self.key_files())

    # --- triggers --------------------------------------------------------------

    async def reload(self, trigger: str) -> dict[str, Any]:
        """Validate the file and apply it. Returns the reload's report (also
        ``ctx.config.last_reload``); raises ConfigError if the file is invalid
        (the old registry keeps serving)."""
        async with self._lock:
            return await self._reload(trigger)

    async def _reload(self, trigger: str) -> dict[str, Any]:
        if self.ctx.draining:
            raise ShuttingDown("mlxd is shutting down; not reloading", retry_after=5)
        digest = file_digest(self.path)
        try:
            # Parsing and sizing read files: keep them off the event loop.
            registry = await asyncio.to_thread(self._loader, self.path)
            # A keys file that became unusable is refused like a bad registry.
            self.settings.api_key_list()
        except ConfigError as error:
            self._seen_hash, self._seen_keys = digest, self._keys_digest()
            self._reject(error, trigger)
            raise
        except Exception as exc:  # a loader bug must not look like a crash to the client
            log.exception("loading %s failed unexpectedly", self.path)
            self._seen_hash, self._seen_keys = digest, self._keys_digest()
            error = ConfigError(describe_exception(exc), file=str(self.path))
            self._reject(error, trigger)
            raise error from None
        self._seen_hash = registry.file_hash
        report = await self._apply(registry, trigger)
        # Read after the apply: the files of the registry now in use.
        self._seen_keys = self._keys_digest()
        return report

    async def on_signal(self) -> None:
        """SIGHUP: errors are already in the log and in /v1/status."""
        try:
            await self.reload("signal")
        except ConfigError:
            pass
        except ShuttingDown:
            log.info("SIGHUP ignored: shutting down")
        except Exception:
            log.exception("reload on SIGHUP failed")

    async def on_file_event(self) -> None:
        """The watcher saw the folder change and things have settled."""
        async with self._lock:
            # Checked under the lock: an explicit reload may just have read
            # this very content, and a second report would only say "unchanged".
            if self.ctx.draining or (file_digest(self.path) == self._seen_hash
                                     and self._keys_digest() == self._seen_keys):
                return
            with contextlib.suppress(ConfigError):
                await self._reload("watch")

    async def start_watching(self) -> None:
        if self._watcher is None:
            self._watcher = ConfigWatcher(self.path, self.on_file_event, self.debounce_s, also=self.key_files)
            await self._watcher.start()
            log.info("watching %s for changes", self.path)

    async def stop_watching(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
            self._watcher = None

    # --- outcomes --------------------------------------------------------------

    def _reject(self, error: ConfigError, trigger: str) -> None:
        config = self.ctx.config
        config.error = error
        config.last_reload = {
            "generation": config.generation,
            "at": time.time(),
            "trigger": trigger,
            "outcome": "invalid",
            "file_hash": self._seen_hash,
            "summary": "invalid; the previous registry keeps serving",
            "models": {},
            "manager": [],
            "backends": [],
            "failover": [],
            "apps": [],
            "server": {"applied": [], "needs_restart": [], "overridden": []},
            "problems": [],
            "error": error.as_dict(),
        }
        self.ctx.events.add("reload", "", f"rejected ({trigger}): {error}; generation {config.generation} keeps serving")
        log.error("configuration rejected, generation %d keeps serving: %s", config.generation, error)

    async def _apply(self, registry: Registry, trigger: str) -> dict[str, Any]:
        ctx = self.ctx
        config = ctx.config
        diff = diff_registries(ctx.registry, registry)
        settings, server = self._settings_for(registry, diff)
        # Keys read from the daemon's keys file change the settings, not the file.
        applied = not diff.is_empty or bool(server["applied"])
        summary = f"server: {', '.join(server['applied'])}" if diff.is_empty and server["applied"] else diff.summary()
        # The settings and the registry change together (reconfigure does not
        # yield to the event loop): no request sees one without the other.
        ctx.settings = settings
        ctx.follow(registry)
        renames = ctx.manager.renamable(dict(diff.renamed))
        preloading = await ctx.manager.reconfigure(registry, renames)
        config.file_hash = registry.file_hash
        config.error = None
        if applied:
            config.generation += 1
            config.applied_at = time.time()
        report = {
            "generation": config.generation,
            "at": time.time(),
            "trigger": trigger,
            "outcome": "applied" if applied else "unchanged",
            "file_hash": registry.file_hash,
            "summary": summary,
            "models": _model_outcomes(diff, preloading, renames),
            "manager": list(diff.manager_fields),
            "backends": list(diff.backends),
            "failover": list(diff.failovers),
            "apps": list(diff.apps),
            "server": server,
            # Models whose files cannot be used: registered, failed, the rest serve.
            "problems": [p.as_dict() for p in registry.problems],
            "error": None,
        }
        config.last_reload = report
        restart = server["needs_restart"]
        note = f"; needs restart: {', '.join(restart)}" if restart else ""
        if applied:
            ctx.events.add("reload", "", f"generation {config.generation} applied ({trigger}): {summary}{note}")
            log.info("configuration generation %d applied (%s): %s", config.generation, trigger, summary)
        else:
            ctx.events.add("reload", "", f"unchanged ({trigger}); generation {config.generation} keeps serving{note}")
            log.info("configuration unchanged (%s)", trigger)
        if restart:
            log.warning("changes to server %s need a restart of mlxd to take effect", ", ".join(restart))
        log_problems(registry)
        return report

    def _settings_for(self, registry: Registry, diff: RegistryDiff) -> tuple[EffectiveSettings, dict[str, list[str]]]:
        """The new effective settings, and which server fields changed how.

        Where mlxd listens cannot change under a running server: host and port
        keep their bound values and are reported as needing a restart."""
        current = self.ctx.settings
        merged = effective(self.settings, registry.server)
        changed = _changed_fields(current.server, merged.server)
        restart = [f for f in changed if f in SERVER_RESTART_FIELDS]
        bound = {f: getattr(current.server, f) for f in SERVER_RESTART_FIELDS}
        merged = replace(merged, server=replace(merged.server, **bound))
        report = {
            "applied": [f for f in changed if f not in SERVER_RESTART_FIELDS],
            "needs_restart": restart,
            # Changed in the file, but a CLI flag or MLXD_* variable wins.
            "overridden": [f for f in diff.server_fields if f not in changed],
        }
        return merged, report


def _changed_fields(old: ServerSpec, new: ServerSpec) -> list[str]:
    return [f.name for f in fields(new) if getattr(old, f.name) != getattr(new, f.name)]


def _model_outcomes(
    diff: RegistryDiff, preloading: list[str], renames: dict[str, str]
) -> dict[str, dict[str, Any]]:
    outcomes: dict[str, dict[str, Any]] = {}
    for change in diff.changes:
        entry: dict[str, Any] = {"change": change.kind, "fields": list(change.fields)}
        if change.kind == "renamed" and renames.get(change.old_name or "") != change.name:
            # Caught mid-load or mid-unload: registered anew, not renamed.
            entry["change"] = "added"
            outcomes[change.old_name or ""] = {"change": "removed", "fields": []}
        elif change.kind == "renamed":
            entry["renamed_from"] = change.old_name
        if change.name in preloading:
            entry["preloading"] = True
        outcomes[change.name] = entry
    return outcomes


def log_problems(registry: Registry) -> None:
    for problem in registry.problems:
        log.error("%s; that model stays failed, the others are served", problem)


def reload_summary(report: dict[str, Any]) -> str:
    """One line for ``mlxd reload``."""
    outcome = report.get("outcome")
    generation = report.get("generation")
    line = f"generation {generation} {outcome}"
    if outcome == "applied":
        line += f": {report.get('summary')}"
    restart = (report.get("server") or {}).get("needs_restart") or []
    if restart:
        line += f" (restart mlxd to apply server {', '.join(restart)})"
    broken = report.get("problems") or []
    if broken:
        line += f"; {len(broken)} model(s) cannot be loaded, see mlxd status"
    return line


def _name_key(path: Path) -> tuple[str, str]:
    # Events may name a folder by another spelling (macOS reports /private/var
    # for /var): compare real folders and plain names.
    return os.path.realpath(path.parent), path.name


def registry_names(path: Path) -> frozenset[tuple[str, str]]:
    """Every name whose change can change what ``path`` reads: the path, each
    symlink met on the way to the file (``..data`` in a Kubernetes ConfigMap
    included) and the file itself, as :func:`_name_key` keys."""
    found: set[Path] = set()
    todo = [Path(os.path.abspath(path))]
    while todo and len(found) < 64:  # bounded: a symlink loop ends here
        p = todo.pop()
        if p in found:
            continue
        found.add(p)
        todo += [a for a in p.parents if a.is_symlink()]
        if p.is_symlink():
            todo.append(Path(os.path.normpath(p.parent / os.readlink(p))))
    found.add(Path(path).resolve())
    return frozenset(_name_key(p) for p in found)


class ConfigWatcher:
    """Turns filesystem noise around one file into settled "look again" calls.

    Watches the folder holding the path and, if it is a symlink, the folder
    holding its target, and keeps only events on :func:`registry_names`.
    A burst of events is one call, made once nothing has moved for
    ``debounce_s``. If the file is missing then, it gets one more
    ``debounce_s`` to come back before the call is made anyway (the reloader
    then reports it missing).
    """

    def __init__(self, path: Path, on_change: Callable[[], Awaitable[None]], debounce_s: float,
                 also: Callable[[], tuple[Path, ...]] = tuple) -> None:
        """``also``: more files whose changes count (the key files), asked again at each event."""
        self.path = path
        self.also = also
        self.on_change = on_change
        self.debounce_s = debounce_s
        self._poked = asyncio.Event()
        self._restart = asyncio.Event()
        self._closing = False
        self._watching: tuple[Path, ...] = ()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._closing = False
        self._tasks = [
            asyncio.create_task(self._watch(), name="mlxd-config-watch"),
            asyncio.create_task(self._settle(), name="mlxd-config-settle"),
        ]

    async def stop(self) -> None:
        self._closing = True
        self._restart.set()
        watch, settle = self._tasks
        settle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await settle
        # The watch thread notices the stop event within a step (~50 ms).
        try:
            await asyncio.wait_for(watch, timeout=5)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        self._tasks = []

    def folders(self) -> tuple[Path, ...]:
        found = set()
        for path in (self.path, *self.also()):
            link = path.absolute()
            found |= {link.parent, link.resolve().parent}
        return tuple(sorted(f for f in found if f.is_dir()))

    async def _watch(self) -> None:
        while not self._closing:
            self._restart.clear()
            self._watching = self.folders()
            if not self._watching:
                await self._pause()
                continue
            try:
                async for _ in awatch(
                    *self._watching,
                    watch_filter=self._concerns_registry,
                    recursive=False,
                    stop_event=self._restart,
                    debounce=int(self.debounce_s * 1000),
                    step=20,
                ):
                    self._poked.set()
            except Exception as exc:  # e.g. a watched folder was removed
                log.debug("config watch restarting: %s", describe_exception(exc))
                self._poked.set()
                await self._pause()

    def _concerns_registry(self, _change: object, path: str) -> bool:
        # Recomputed per event: a symlink swap changes which names matter.
        key = _name_key(Path(path))
        return any(key in registry_names(p) for p in (self.path, *self.also()))

    async def _pause(self) -> None:
        await asyncio.sleep(self.debounce_s)

    async def _poked_within(self, seconds: float) -> bool:
        self._poked.clear()
        return await event_set_within(self._poked, seconds)

    async def _settle(self) -> None:
        while True:
            await self._poked.wait()
            while await self._poked_within(self.debounce_s):
                pass  # still moving
            if not self.path.exists() and await self._poked_within(self.debounce_s):
                continue  # it came back (or something else moved): settle again
            try:
                await self.on_change()
            except Exception:
                log.exception("reloading after a change to %s failed", self.path)
            if self.folders() != self._watching:
                self._restart.set()  # a symlink now points elsewhere
