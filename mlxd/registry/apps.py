"""``apps:`` -> AppSpecs: each app's key found (an environment variable, a
file, or a sha256 the file keeps) and kept as its sha256 only, so no plain
key outlives the load. Every problem names the file, line and key, and
never the key's value."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

from mlxd.registry.document import Document, Loc
from mlxd.registry.model import AppSpec, ServerSpec
from mlxd.registry.schema import AppEntry

KEY_SOURCES = ("key", "key_env", "key_file", "key_sha256")
# What an environment variable's name looks like. A key pasted where its
# variable's name belongs (``key_env: sk-...``) is not: it is then not
# repeated in the error, which goes to the log, `mlxd check` and status.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def unset_variable(name: str, holds: str) -> str:
    """The error for ``name`` (a ``*key_env`` value) not set in the
    environment; ``holds`` says whose key it is."""
    if _ENV_NAME.fullmatch(name):
        return f"the environment variable `{name}` is not set (it holds {holds})"
    return (f"this is not an environment variable's name (letters, digits and _), so it is not shown: is the key "
            f"itself written here? Put the key in the environment and name the variable here (it holds {holds})")


def build_apps(
    doc: Document, entries: list[AppEntry] | None, base_dir: Path, env: Mapping[str, str] | None,
    server: ServerSpec = ServerSpec(),
) -> tuple[AppSpec, ...] | None:
    """``server``: the file's own section, whose keys no app may share."""
    if entries is None:
        return None
    environ = os.environ if env is None else env
    apps: list[AppSpec] = []
    names: dict[str, int] = {}
    hashes: dict[str | None, int] = {}
    # A key names one caller: an app's key that is also an admin or a
    # read-only key would be the app's alone (its scope, its admin flag),
    # and the other would quietly stop working as such.
    flat = {_digest(k): f"server.{field}[{j}]" for field in ("read_only_keys", "api_keys")
            for j, k in enumerate(getattr(server, field))}
    for i, entry in enumerate(entries):
        here: Loc = ("apps", i)
        if entry.name in names:
            raise doc.error((*here, "name"), f"the app name `{entry.name}` is already used by apps[{names[entry.name]}]")
        names[entry.name] = i
        digest = _key_digest(doc, here, entry, base_dir, environ)
        if digest in hashes:
            what = "a keyless app (`key: none`)" if digest is None else "the same key"
            raise doc.error((*here, "name"), f"apps[{hashes[digest]}] already has {what}; each app needs its own")
        if digest in flat:
            raise doc.error((*here, "name"), f"app `{entry.name}` has the same key as {flat[digest]}; a key names "
                                             "one caller: give the app its own key, or drop the other")
        hashes[digest] = i
        apps.append(AppSpec(
            name=entry.name, key_sha256=digest, models=tuple(entry.models), routes=tuple(dict.fromkeys(entry.routes)),
            admin=entry.admin, priority=entry.priority, max_concurrency=entry.max_concurrency, rpm=entry.rpm,
            tpm=entry.tpm, tokens_per_day=entry.tokens_per_day,
            key_file=_key_path(entry.key_file, base_dir) if entry.key_file is not None else None,
        ))
    return tuple(apps)


def _key_digest(doc: Document, here: Loc, entry: AppEntry, base_dir: Path, environ: Mapping[str, str]) -> str | None:
    given = [k for k in KEY_SOURCES if getattr(entry, k) is not None]
    if len(given) != 1:
        problem = "no key" if not given else f"{len(given)} keys ({', '.join(given)})"
        raise doc.error(here if not given else (*here, given[1]),
                        f"app `{entry.name}` has {problem}; give exactly one of key_env, key_file, key_sha256 "
                        "or `key: none`")
    source = given[0]
    if source == "key":
        return None
    if source == "key_sha256":
        return entry.key_sha256
    if source == "key_env":
        assert entry.key_env is not None
        value = environ.get(entry.key_env, "").strip()
        if not value:
            raise doc.error((*here, "key_env"), unset_variable(entry.key_env, f"the key of app `{entry.name}`"))
        return _digest(value)
    assert entry.key_file is not None
    path = _key_path(entry.key_file, base_dir)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise doc.error((*here, "key_file"), f"cannot read the key file {_shown(entry.key_file, path)}: {reason}") from None
    if not value or any(ch.isspace() for ch in value):
        raise doc.error((*here, "key_file"),
                        f"the key file {_shown(entry.key_file, path)} must hold one key, with no spaces inside")
    return _digest(value)


def _key_path(given: str, base_dir: Path) -> Path:
    """A ``key_file`` as read: relative to the registry's folder."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else base_dir / path


def _shown(given: str, path: Path) -> str:
    """The key file as an error names it: its path, unless what was written
    looks like no path at all (no directory, no extension) but could be a
    key pasted there, which is then not repeated."""
    if "/" in given or "\\" in given or "." in given or given.startswith("~") or len(given) < 16:
        return str(path)
    return f"that key_file names (a bare name, not shown; relative to {path.parent})"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()
