"""``models.yaml`` -> :class:`~mlxd.registry.model.Registry`.

Every problem is a :class:`~mlxd.errors.ConfigError` naming the file, the
1-based line and the dotted key (``models[1].max_context``). Problems in the
file itself are raised. Problems with one model's files on disk (a missing
folder, corrupt weights, a bad config.json) are not: that model comes back
``broken`` and its located error is in ``Registry.problems``. The YAML is
composed into a node tree once; pydantic's error locations and our own
cross-key checks are both located by walking that tree.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from mlxd.errors import ConfigError
from mlxd.registry.model import (
    BackendSpec,
    ContentionSpec,
    FailoverSpec,
    Footprint,
    ManagerSpec,
    ModelSpec,
    PrefixCacheSpec,
    Registry,
    SamplingDefaults,
    ServerSpec,
)
from mlxd.registry.resolve import Downloader, detect_kind, read_model_config, resolve_model_dir
from mlxd.registry.schema import (
    FAILOVER_KEYS,
    LOCATION_KEYS,
    PHYSICAL_MEMORY,
    REMOTE_KEYS,
    ENCODER_KEYS,
    VLLM_MLX_IGNORED_MODEL_KEYS,
    ManagerSection,
    ModelEntry,
    RegistryFile,
    physical_memory_bytes,
    section_for_path,
)
from mlxd.registry.sizing import (
    encoder_activation_bytes,
    format_bytes,
    kv_cache_bytes,
    max_position_embeddings,
    parse_memory_budget,
    weights_bytes,
)

logger = logging.getLogger(__name__)

# Requests an embedding or rerank model serves at once unless its entry says.
ENCODER_CONCURRENCY = 64

Loc = tuple[str | int, ...]

DEFAULT_MEMORY_BUDGET = "70%"
# Defaults come from the contract dataclasses so the two can never disagree.
_DEFAULT_MODEL = ModelSpec(name="", path=Path(), source="")
_DEFAULT_MANAGER = ManagerSpec(memory_budget_bytes=1)
DEFAULT_MAX_CONTEXT = _DEFAULT_MODEL.max_context
TEXT_FILE_LABEL = "<string>"
_SECRET_KEYS = frozenset({"api_keys"})


def load_registry(
    path: Path,
    *,
    env: Mapping[str, str] | None = None,
    physical_memory: int | None = None,
    downloader: Downloader | None = None,
) -> Registry:
    """Read, validate and resolve the registry file at ``path``.

    ``env`` (the Hugging Face cache variables), ``physical_memory`` (for
    ``"70%"`` budgets) and ``downloader`` (for ``allow_download``) default to
    the real ones; tests pass their own.
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
    return _load(text, data, path, env=env, physical_memory=physical_memory, downloader=downloader)


def load_registry_text(
    text: str,
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    physical_memory: int | None = None,
    downloader: Downloader | None = None,
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
    )


def _load(
    text: str,
    raw: bytes,
    path: Path | None,
    *,
    env: Mapping[str, str] | None,
    physical_memory: int | None,
    downloader: Downloader | None,
) -> Registry:
    label = str(path) if path is not None else TEXT_FILE_LABEL
    doc = _Document.parse(text, label)
    memory = physical_memory or physical_memory_bytes()
    parsed = doc.validate(memory)
    base_dir = path.absolute().parent if path is not None else Path.cwd()
    builder = _Builder(doc, parsed, base_dir, memory, env, downloader)
    registry = Registry(
        source_path=path.absolute() if path is not None else None,
        file_hash=hashlib.sha256(raw).hexdigest(),
        manager=builder.manager(),
        server=builder.server(),
        backends=builder.backends(),
        models=builder.models(),
        failovers=builder.failovers(),
        problems=tuple(builder.problems),
    )
    _warn_if_pinned_do_not_fit(registry, label)
    return registry


# --------------------------------------------------------------------------- YAML


@dataclass(frozen=True)
class _Document:
    """The parsed file: its data and the node tree that knows every line."""

    label: str
    root: yaml.Node
    data: Any

    @classmethod
    def parse(cls, text: str, label: str) -> _Document:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise ConfigError(
                    "the file is empty; it needs at least a `models` list", file=label, line=1
                )
            _reject_duplicate_keys(root, label)
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            problem = exc.problem or exc.context or "invalid YAML"
            raise ConfigError(f"YAML syntax error: {problem}", file=label, line=line) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"YAML error: {type(exc).__name__}", file=label) from None
        finally:
            loader.dispose()
        if not isinstance(data, dict):
            raise ConfigError(
                "the top level must be a mapping with `models` (and optionally "
                "`manager` and `server`)",
                file=label,
                line=root.start_mark.line + 1,
            )
        return cls(label, root, data)

    def line_of(self, loc: Loc) -> int:
        """The line of the deepest part of ``loc`` present in the file: a key's
        line for a mapping entry, the item's line for a list entry."""
        node = self.root
        line = node.start_mark.line + 1
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                pair = _find_key(node, part)
                if pair is None:
                    break
                line = pair[0].start_mark.line + 1
                node = pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def error(self, loc: Loc, message: str) -> ConfigError:
        return ConfigError(message, file=self.label, line=self.line_of(loc), key=key_path(loc))

    def validate(self, physical_memory: int) -> RegistryFile:
        data = {
            k: ({} if v is None and k in ("server", "manager") else v) for k, v in self.data.items()
        }
        try:
            return RegistryFile.model_validate(data, context={PHYSICAL_MEMORY: physical_memory})
        except ValidationError as exc:
            errors = exc.errors()
        # The first problem in reading order, so fixing top-down converges; on
        # one line an unknown key goes first (it often explains a missing one).
        errors.sort(key=lambda e: (self.line_of(_data_loc(e)), e["type"] != "extra_forbidden"))
        problems = [self.error(_data_loc(e), _message(e, _data_loc(e))) for e in errors]
        first, more = problems[0], len(problems) - 1
        if more:
            detail = (
                f"{first.detail} (and {more} more problem{'s' if more > 1 else ''} in this file)"
            )
            first = ConfigError(detail, file=first.file, line=first.line, key=first.key)
        raise first from None


def _data_loc(err: Mapping[str, Any]) -> Loc:
    return tuple(p for p in err["loc"] if isinstance(p, (str, int)))


def _find_key(node: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    # Last wins: after a ``<<`` merge the explicit keys follow the merged ones.
    for key_node, value_node in reversed(node.value):
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def _reject_duplicate_keys(root: yaml.Node, label: str) -> None:
    """PyYAML keeps the last of two equal keys silently; we refuse them."""
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    visited: set[int] = set()
    while stack:
        node, loc = stack.pop()
        if id(node) in visited:  # anchors and aliases make the tree a graph
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
        if not isinstance(node, yaml.MappingNode):
            continue
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":
                continue
            stack.append((value_node, (*loc, key)))
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConfigError(
                    f"`{key}` appears twice in this mapping (first on line {first_line[key]})",
                    file=label,
                    line=line,
                    key=key_path((*loc, key)),
                )
            first_line[key] = line


def key_path(loc: Loc) -> str | None:
    """``("models", 1, "max_context")`` -> ``models[1].max_context``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def _message(err: Mapping[str, Any], loc: Loc) -> str:
    kind = err["type"]
    name = loc[-1] if loc else ""
    if kind == "extra_forbidden":
        return _unknown_key_message(str(name), loc[:-1])
    if kind == "missing":
        if loc == ("models",):
            return "the file needs a `models` list with at least one model"
        return f"required key `{name}` is missing"
    if kind == "too_short" and loc == ("models",):
        return "`models` is empty; list at least one model"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys, got {_show(err.get('input'))}"
    if kind == "list_type":
        return f"expected a list, got {_show(err.get('input'))}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return message
    message = f"{message[:1].lower()}{message[1:]}"
    # Errors reach logs and /v1/status; never echo what may be a secret.
    if any(part in _SECRET_KEYS for part in loc):
        return message
    return f"{message}, got {_show(err.get('input'))}"


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key_message(key: str, parent: Loc) -> str:
    section = section_for_path(parent)
    valid = sorted(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown key `{key}`; did you mean `{close[0]}`?"
    if valid:
        return f"unknown key `{key}`; valid keys here: {', '.join(valid)}"
    return f"unknown key `{key}`"


# ----------------------------------------------------------------------- building


class _Builder:
    """Turns the validated file into frozen specs, with the checks that span keys."""

    def __init__(
        self,
        doc: _Document,
        parsed: RegistryFile,
        base_dir: Path,
        physical_memory: int,
        env: Mapping[str, str] | None,
        downloader: Downloader | None,
    ) -> None:
        self.doc = doc
        self.parsed = parsed
        self.base_dir = base_dir
        self.physical_memory = physical_memory
        self.env = env
        self.downloader = downloader
        self._manager: ManagerSpec | None = None
        self._server: ServerSpec | None = None
        self.problems: list[ConfigError] = []
        self._failovers: list[FailoverSpec] = []
        # Failover targets written `backend:model`, by that name.
        self._implicit: dict[str, ModelSpec] = {}

    def manager(self) -> ManagerSpec:
        if self._manager is None:
            self._manager = self._build_manager(self.parsed.manager)
        return self._manager

    def server(self) -> ServerSpec:
        if self._server is None:
            s = self.parsed.server
            if s.default_max_tokens > s.max_request_tokens:
                raise self.doc.error(
                    ("server", "default_max_tokens"),
                    f"{s.default_max_tokens} is above server.max_request_tokens "
                    f"({s.max_request_tokens})",
                )
            self._server = ServerSpec(
                host=s.host,
                port=s.port,
                api_keys=tuple(s.api_keys),
                default_max_tokens=s.default_max_tokens,
                max_request_tokens=s.max_request_tokens,
                request_timeout_s=s.request_timeout_s,
                shutdown_grace_seconds=s.shutdown_grace_seconds,
                max_body_bytes=s.max_body_bytes,
                max_prompts=s.max_prompts,
                allowed_hosts=tuple(s.allowed_hosts),
                allowed_origins=tuple(s.allowed_origins),
                max_connections=s.max_connections,
                header_timeout_s=s.header_timeout_s,
                body_timeout_s=s.body_timeout_s,
                max_image_memory_bytes=s.max_image_memory,
            )
        return self._server

    def _build_manager(self, m: ManagerSection) -> ManagerSpec:
        both = self._either(("manager",), m, "memory_budget", "memory_budget_gb")
        budget = (
            both
            if both is not None
            else parse_memory_budget(DEFAULT_MEMORY_BUDGET, self.physical_memory)
        )
        idle = self._either(("manager",), m, "default_idle_unload_seconds", "idle_unload_seconds")
        if idle is None:
            idle = _DEFAULT_MANAGER.default_idle_unload_seconds
        policy = m.contention_policy
        defaults = ContentionSpec()
        contention = ContentionSpec(
            strategy=policy.strategy,
            wait_timeout_s=defaults.wait_timeout_s
            if policy.wait_timeout_s is None
            else policy.wait_timeout_s,
            preempt_after_s=defaults.preempt_after_s
            if policy.preempt_after_s is None
            else policy.preempt_after_s,
        )
        if (
            contention.strategy == "wait_then_preempt"
            and contention.preempt_after_s > contention.wait_timeout_s
        ):
            raise self.doc.error(
                ("manager", "contention_policy", "preempt_after_s"),
                f"{contention.preempt_after_s:g} s is after wait_timeout_s "
                f"({contention.wait_timeout_s:g} s), so preemption would never start",
            )
        if m.load_retry_backoff_s > m.load_retry_backoff_max_s:
            raise self.doc.error(
                ("manager", "load_retry_backoff_s"),
                f"{m.load_retry_backoff_s:g} s is above load_retry_backoff_max_s "
                f"({m.load_retry_backoff_max_s:g} s)",
            )
        return ManagerSpec(
            memory_budget_bytes=budget,
            default_idle_unload_seconds=max(0.0, idle),
            contention=contention,
            cache_dir=self._local_path(m.cache_dir),
            max_pass_over_s=m.max_pass_over_s,
            load_retry_backoff_s=m.load_retry_backoff_s,
            load_retry_backoff_max_s=m.load_retry_backoff_max_s,
        )

    def _either(self, loc: Loc, section: Any, ours: str, theirs: str) -> Any:
        """One value set under two spellings (ours and vllm-mlx's): both is an error."""
        a, b = getattr(section, ours), getattr(section, theirs)
        if a is not None and b is not None:
            raise self.doc.error((*loc, theirs), f"set either `{ours}` or `{theirs}`, not both")
        return a if a is not None else b

    def _local_path(self, raw: str) -> Path:
        p = Path(raw).expanduser()
        return p if p.is_absolute() else self.base_dir / p

    def _prefix_cache(self, entry: ModelEntry) -> PrefixCacheSpec:
        fields: dict[str, Any] = {}
        for name in ("max_bytes", "disk_max_bytes", "persist"):
            for section in (entry.prefix_cache, self.parsed.manager.prefix_cache):
                value = getattr(section, name)
                if value is not None:
                    fields[name] = value
                    break
            else:
                fields[name] = getattr(_DEFAULT_MODEL.prefix_cache, name)
        return PrefixCacheSpec(**fields)

    def models(self) -> tuple[ModelSpec, ...]:
        """Every model, the failover entries' implicit targets last; the
        failover entries themselves come from ``failovers()`` after this."""
        self._check_names()
        entries = list(enumerate(self.parsed.models))
        specs = [self._model(i, entry) for i, entry in entries if entry.targets is None]
        self._failovers = [self._failover(i, entry) for i, entry in entries if entry.targets is not None]
        return (*specs, *self._implicit.values())

    def failovers(self) -> tuple[FailoverSpec, ...]:
        return tuple(self._failovers)

    def _failover(self, i: int, entry: ModelEntry) -> FailoverSpec:
        here: Loc = ("models", i)
        other = [k for k in entry.model_fields_set if k not in FAILOVER_KEYS]
        if other:
            key = min(other, key=lambda k: self.doc.line_of((*here, k)))
            raise self.doc.error(
                (*here, key),
                f"`{key}` is not a failover setting; `{entry.name}` is served by its targets, which "
                f"hold the models (a failover entry takes only: {', '.join(FAILOVER_KEYS)})",
            )
        targets: list[str] = []
        for j, written in enumerate(entry.targets or ()):
            target = self._target((*here, "targets", j), written)
            if target in targets:
                raise self.doc.error((*here, "targets", j), f"`{written}` is listed twice")
            targets.append(target)
        return FailoverSpec(
            name=entry.name,
            targets=tuple(targets),
            strategy=entry.strategy or "warm",
            aliases=tuple(entry.aliases),
            description=entry.description,
            defaults=self._sampling(i, entry),
            local_image_dir=self._image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
        )

    def _target(self, at: Loc, written: str) -> str:
        """A failover target: an entry of this file (by name or alias), or
        ``backend:model`` for a model on a backend that has no entry."""
        named = next((e for e in self.parsed.models if written == e.name or written in e.aliases), None)
        backend, colon, model = written.partition(":")
        on_backend = bool(colon and model) and backend in self.parsed.backends
        if named is not None and on_backend:
            raise self.doc.error(
                at, f"`{written}` is both an entry's name and a model on backend `{backend}`; rename the entry"
            )
        if named is not None:
            if named.targets is not None:
                raise self.doc.error(
                    at, f"`{written}` is a failover entry itself; a target must be a model (local or remote)"
                )
            return named.name
        if not on_backend:
            known = ", ".join(f"`{n}`" for n in self.parsed.backends) or "none are defined"
            raise self.doc.error(
                at,
                f"unknown target `{written}`: not an entry of this file, nor `backend:model` on a "
                f"backend under `backends:` ({known})",
            )
        if written not in self._implicit:
            self._implicit[written] = self._remote_spec(written, backend, model, implicit=True)
        return written

    def _check_names(self) -> None:
        used: dict[str, Loc] = {}
        for i, entry in enumerate(self.parsed.models):
            candidates: list[tuple[str, Loc]] = [(entry.name, ("models", i, "name"))]
            candidates += [(a, ("models", i, "aliases", j)) for j, a in enumerate(entry.aliases)]
            for name, loc in candidates:
                if name in used:
                    first = used[name]
                    where = f"{key_path(first)} on line {self.doc.line_of(first)}"
                    raise self.doc.error(loc, f"the name `{name}` is already used by {where}")
                used[name] = loc

    def backends(self) -> tuple[BackendSpec, ...]:
        env = os.environ if self.env is None else self.env
        specs = []
        for name, b in self.parsed.backends.items():
            if b.api_key_env is not None and not env.get(b.api_key_env):
                raise self.doc.error(
                    ("backends", name, "api_key_env"),
                    f"the environment variable `{b.api_key_env}` is not set (it holds the key for `{name}`)",
                )
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

    def _remote_model(self, i: int, entry: ModelEntry) -> ModelSpec:
        """An entry served by a backend: nothing local to resolve, size or
        load, so it costs nothing against the memory budget."""
        here: Loc = ("models", i)
        backend = self.parsed.backends.get(entry.backend or "")
        if backend is None:
            known = ", ".join(f"`{n}`" for n in self.parsed.backends) or "none are defined"
            raise self.doc.error(
                (*here, "backend"), f"unknown backend `{entry.backend}` (backends: {known})"
            )
        local = [k for k in entry.model_fields_set if k not in REMOTE_KEYS]
        if local:
            key = min(local, key=lambda k: self.doc.line_of((*here, k)))
            raise self.doc.error(
                (*here, key),
                f"`{key}` is a local-model setting; `{entry.name}` is served by backend "
                f"`{entry.backend}` (a remote entry takes only: {', '.join(REMOTE_KEYS)})",
            )
        return self._remote_spec(
            entry.name,
            entry.backend or "",
            entry.remote_model or entry.name,
            aliases=tuple(entry.aliases),
            description=entry.description,
            max_queue=entry.max_queue,
            defaults=self._sampling(i, entry),
            local_image_dir=self._image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
            kind=entry.kind or "text",
        )

    def _remote_spec(self, name: str, backend: str, remote_model: str, **given: Any) -> ModelSpec:
        return ModelSpec(
            name=name,
            path=Path(),
            source=f"{backend}:{remote_model}",
            idle_unload_seconds=0.0,
            max_concurrency=self.parsed.backends[backend].max_concurrency,
            prefix_cache=PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False),
            backend=backend,
            remote_model=remote_model,
            **given,
        )

    def _model(self, i: int, entry: ModelEntry) -> ModelSpec:
        here: Loc = ("models", i)
        if entry.strategy is not None:
            raise self.doc.error(
                (*here, "strategy"), "`strategy` is for failover entries; list the models under `targets:`"
            )
        if entry.backend is not None:
            return self._remote_model(i, entry)
        if entry.remote_model is not None:
            raise self.doc.error(
                (*here, "remote_model"), "`remote_model` needs a `backend` to name the model on"
            )
        located = entry.location()
        if located is None:
            given = [k for k in LOCATION_KEYS if getattr(entry, k) is not None]
            if given:
                raise self.doc.error(
                    (*here, given[1]),
                    f"set only one of `{'`, `'.join(given)}`; they all name the model's files",
                )
            raise self.doc.error(
                here, f"model `{entry.name}` needs a `path` (a folder or a Hugging Face repo id)"
            )
        location_key, source = located
        at_location: Loc = (*here, location_key)
        self._note_ignored_keys(i, entry)

        override = None
        if entry.estimated_memory_gb is not None:
            override = int(entry.estimated_memory_gb * 1024**3)
        broken: str | None = None
        try:
            folder = resolve_model_dir(
                source,
                base_dir=self.base_dir,
                allow_download=entry.allow_download,
                env=self.env,
                downloader=self.downloader,
                gguf_cache=self.manager().cache_dir,
            )
            config = read_model_config(folder)
            weights = weights_bytes(folder)
        except ConfigError as exc:
            broken = exc.detail
            folder, config, weights = self._local_path(source), {}, 0

        kind = entry.kind or ("vision" if entry.mllm else detect_kind(config, folder))
        self._check_encoder_keys(i, entry, kind)
        max_context = self._max_context(i, entry, config)
        prefix_cache = self._prefix_cache(entry)
        if kind in ("vision", "embedding", "rerank"):
            # These engines keep no prefix cache: reserving memory for one
            # would only crowd other models out.
            prefix_cache = PrefixCacheSpec(max_bytes=0, disk_max_bytes=0, persist=False)
        kv = 0  # estimated_memory_gb stands in for what cannot be computed
        if broken is None and kind in ("embedding", "rerank"):
            kv = encoder_activation_bytes(config, entry.batch_tokens or ModelSpec.batch_tokens)
        elif broken is None:
            try:
                kv = kv_cache_bytes(config, max_context, entry.max_concurrency, entry.kv_bits)
            except ConfigError as exc:
                if override is None:
                    broken = exc.detail  # config.json lacks the model's dimensions
        if broken is not None:
            self.problems.append(self.doc.error(at_location, broken))
            weights = 0
        footprint = Footprint(weights=weights, kv_cache=kv, prefix_cache=prefix_cache.max_bytes)

        spec = ModelSpec(
            name=entry.name,
            path=folder,
            source=source,
            kind=kind,
            aliases=tuple(entry.aliases),
            description=entry.description,
            preload=entry.preload,
            pinned=entry.pinned,
            idle_unload_seconds=(
                self.manager().default_idle_unload_seconds
                if entry.idle_unload_seconds is None
                else entry.idle_unload_seconds
            ),
            max_context=max_context,
            max_concurrency=self._max_concurrency(entry, kind),
            max_queue=entry.max_queue,
            kv_bits=entry.kv_bits,
            defaults=self._sampling(i, entry),
            prefix_cache=prefix_cache,
            footprint=footprint,
            memory_override_bytes=override,
            trust_remote_code=entry.trust_remote_code,
            local_image_dir=self._image_dir(i, entry),
            allow_remote_images=entry.allow_remote_images,
            tool_parser=entry.tool_parser,
            broken=broken,
            **self._encoder_settings(entry),
        )
        self._check_fits(here, spec)
        return spec

    def _check_encoder_keys(self, i: int, entry: ModelEntry, kind: str) -> None:
        if kind in ("embedding", "rerank"):
            return
        for key in ENCODER_KEYS:
            if getattr(entry, key) is not None:
                raise self.doc.error(("models", i, key), f"`{key}` is for `kind: embedding` and `kind: rerank` "
                                     f"entries; `{entry.name}` is a {kind} model")

    @staticmethod
    def _max_concurrency(entry: ModelEntry, kind: str) -> int:
        """Embedding and rerank requests hold their lease only while their
        inputs are batched with everyone else's, so many may hold one at once."""
        if kind in ("embedding", "rerank") and "max_concurrency" not in entry.model_fields_set:
            return ENCODER_CONCURRENCY
        return entry.max_concurrency

    @staticmethod
    def _encoder_settings(entry: ModelEntry) -> dict[str, Any]:
        return {key: getattr(entry, key) for key in ENCODER_KEYS if getattr(entry, key) is not None}

    def _max_context(self, i: int, entry: ModelEntry, config: Mapping[str, Any]) -> int:
        trained = max_position_embeddings(config)
        if entry.max_context is None:
            return min(DEFAULT_MAX_CONTEXT, trained) if trained else DEFAULT_MAX_CONTEXT
        if trained and entry.max_context > trained:
            logger.warning(
                "%s:%d: models[%d].max_context %d is beyond the %d positions `%s` was trained "
                "for; output past that point may degrade",
                self.doc.label,
                self.doc.line_of(("models", i, "max_context")),
                i,
                entry.max_context,
                trained,
                entry.name,
            )
        return entry.max_context

    def _sampling(self, i: int, entry: ModelEntry) -> SamplingDefaults:
        d = entry.defaults
        limit = self.server().max_request_tokens
        if d.max_tokens is not None and d.max_tokens > limit:
            raise self.doc.error(
                ("models", i, "defaults", "max_tokens"),
                f"{d.max_tokens} is above server.max_request_tokens ({limit})",
            )
        return SamplingDefaults(**d.model_dump())

    def _image_dir(self, i: int, entry: ModelEntry) -> Path | None:
        if entry.local_image_dir is None:
            return None
        folder = self._local_path(entry.local_image_dir)
        if not folder.is_dir():
            raise self.doc.error(
                ("models", i, "local_image_dir"), f"folder {folder} does not exist"
            )
        return folder.resolve()

    def _check_fits(self, here: Loc, spec: ModelSpec) -> None:
        budget = self.manager().memory_budget_bytes
        if spec.charge_bytes <= budget:
            return
        needs, has = format_bytes(spec.charge_bytes), format_bytes(budget)
        if needs == has:  # rounding hid the difference
            needs, has = f"{spec.charge_bytes:,} bytes", f"{budget:,} bytes"
        if spec.memory_override_bytes is not None:
            why = "estimated_memory_gb"
        else:
            f = spec.footprint
            # An encoder's second part is one forward pass's activations.
            second = "activations" if spec.kind in ("embedding", "rerank") else "KV cache"
            why = (
                f"weights {format_bytes(f.weights)} + {second} {format_bytes(f.kv_cache)} + "
                f"prefix cache {format_bytes(f.prefix_cache)}; lower max_context, "
                "max_concurrency or prefix_cache.max_bytes, or set kv_bits"
            )
        raise self.doc.error(here, f"`{spec.name}` needs {needs} but the budget is {has} ({why})")

    def _note_ignored_keys(self, i: int, entry: ModelEntry) -> None:
        for key in VLLM_MLX_IGNORED_MODEL_KEYS:
            if key in entry.model_fields_set:
                logger.info(
                    "%s:%d: models[%d].%s is a vllm-mlx setting mlxd does not use; ignored",
                    self.doc.label,
                    self.doc.line_of(("models", i, key)),
                    i,
                    key,
                )


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
